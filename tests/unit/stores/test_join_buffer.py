"""Values given as pieces, joined into one reused buffer."""

from __future__ import annotations

import threading

import numpy

from kvmux.stores.join_buffer import JoinBuffer


def _items(sizes: list[int]) -> list[tuple[bytes, list[memoryview | bytes]]]:
    rng = numpy.random.default_rng(0)
    items: list[tuple[bytes, list[memoryview | bytes]]] = []
    for n, size in enumerate(sizes):
        data = rng.integers(0, 256, size, dtype=numpy.uint8)
        half = size // 2
        items.append((b"k%d" % n, [b"h", memoryview(data[:half]), data[half:].data]))
    return items


def _joined(parts: list[memoryview | bytes]) -> bytes:
    return b"".join(bytes(part) for part in parts)


def test_every_value_comes_back_joined_in_order_in_batches_that_fit() -> None:
    items = _items([30, 40, 50, 10])
    joiner = JoinBuffer(size=100)
    seen: list[tuple[bytes, bytes]] = []
    batches = 0
    for batch in joiner.batches(items):
        batches += 1
        assert sum(len(value) for _, value in batch) <= 100
        seen += [(key, bytes(value)) for key, value in batch]  # valid until the next batch
    assert seen == [(key, _joined(parts)) for key, parts in items]
    assert batches == 2  # 31 + 41 fit, then 51 + 11


def test_the_buffer_is_reused_from_call_to_call() -> None:
    joiner = JoinBuffer(size=100)
    first = [value for batch in joiner.batches(_items([20])) for _, value in batch]
    second = [value for batch in joiner.batches(_items([20, 20])) for _, value in batch]
    assert isinstance(first[0], memoryview) and isinstance(second[0], memoryview)
    assert first[0].obj is second[0].obj  # one allocation


def test_a_value_larger_than_the_buffer_is_joined_apart() -> None:
    items = _items([10, 500, 10])
    batches = list(JoinBuffer(size=100).batches(items))
    values = [value for batch in batches for _, value in batch]
    assert [bytes(v) for v in values] == [_joined(parts) for _, parts in items]
    assert isinstance(values[1], bytes)


def test_while_another_thread_holds_the_buffer_values_are_joined_fresh() -> None:
    joiner = JoinBuffer(size=100)
    holding = joiner.batches(_items([10]))
    next(holding)  # this iteration holds the buffer
    found: list[object] = []
    thread = threading.Thread(
        target=lambda: found.extend(v for b in joiner.batches(_items([10])) for _, v in b)
    )
    thread.start()
    thread.join()
    assert isinstance(found[0], bytes)
    holding.close()  # ends the iteration: the buffer is free again
    again = [v for b in joiner.batches(_items([10])) for _, v in b]
    assert isinstance(again[0], memoryview)


def test_nothing_to_join_yields_nothing() -> None:
    assert list(JoinBuffer(size=100).batches([])) == []
