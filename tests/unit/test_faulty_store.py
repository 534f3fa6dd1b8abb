"""FaultyStore, the test tool: each fault does what it says, on the calls it names."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvmux import codec
from kvmux.errors import CorruptEntry, StoreError, StoreUnavailable
from kvmux.stores import DictStore, DiskStore, KVStore
from tests.support.faulty_store import (
    GROUPS,
    FaultSpec,
    FaultyStore,
    read_record,
    write_control,
)

NS = bytes(16)
LAYERS = (codec.LayerSpec((4, 8), "float32"),)


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _entry(i: int) -> bytes:
    """A real encoded entry, so that spoiled values can be shown to fail verification."""
    return codec.encode(NS, _key(i), LAYERS, (bytes([i % 251]) * 128,))


@pytest.fixture(params=["dict", "disk"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    store: KVStore
    if request.param == "dict":
        store = DictStore(1 << 20, name="inner")
    else:
        store = DiskStore(tmp_path / "disk", 1 << 20, name="inner")
    yield store
    store.close()


@pytest.fixture
def control(tmp_path: Path) -> Path:
    return tmp_path / "faults.json"


@pytest.fixture
def store(inner: KVStore, control: Path) -> FaultyStore:
    for i in range(3):
        inner.put(_key(i), _entry(i))
    return FaultyStore(inner, control)


KEYS = [_key(i) for i in range(3)]


def _bytes(value: bytes | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


def _reads(store: KVStore) -> list[object]:
    return [
        store.get(KEYS[0]),
        _bytes(store.get_into(KEYS[1], bytearray(4096))),
        store.get_many(KEYS),
        store.contains(KEYS[0]),
        store.contains_many(KEYS),
        store.count_prefix(KEYS),
    ]


def test_no_control_file_passes_everything_through(store: FaultyStore, inner: KVStore) -> None:
    assert (store.name, store.capacity) == (inner.name, inner.capacity)
    assert (store.batched_io, store.parallel_reads) == (inner.batched_io, inner.parallel_reads)
    assert _reads(store) == _reads(inner)
    assert store.put(_key(9), b"x") and store.get(_key(9)) == b"x"
    store.delete(_key(9))
    assert not inner.contains(_key(9))
    assert store.used_bytes() == inner.used_bytes()
    assert not store.injected


def test_every_store_method_is_wrapped() -> None:
    """A method the contract gains must reach the inner store, not the base default."""
    public = {n for n in dir(KVStore) if not n.startswith("_") and callable(getattr(KVStore, n))}
    assert public <= set(vars(FaultyStore))
    wrapped = {m for methods in GROUPS.values() for m in methods}
    assert public - wrapped == {"used_bytes", "limit_values", "close"}


def test_generation_is_the_inner_stores(store: FaultyStore, inner: KVStore, control: Path) -> None:
    store.write_generation(b"record one")
    assert inner.read_generation() == store.read_generation() == b"record one"
    write_control(control, fault="error", on="reads")
    with pytest.raises(StoreError):
        store.read_generation()
    write_control(control, fault="error", on="writes")
    with pytest.raises(StoreError):
        store.write_generation(b"record two")
    assert inner.read_generation() == b"record one"


def test_none_passes_everything_through(store: FaultyStore, inner: KVStore, control: Path) -> None:
    write_control(control, fault="none")
    assert _reads(store) == _reads(inner)
    assert store.put_many([(_key(8), b"y")]) == [True]
    assert not store.injected


@pytest.mark.parametrize("error, kind", [("store", StoreError), ("unavailable", StoreUnavailable)])
def test_error_on_reads_raises_from_every_read(
    store: FaultyStore, control: Path, error: str, kind: type[StoreError]
) -> None:
    write_control(control, fault="error", on="reads", error=error)
    calls: list[Callable[[], object]] = [
        lambda: store.get(KEYS[0]),
        lambda: store.get_into(KEYS[0], bytearray(4096)),
        lambda: store.get_many(KEYS),
        lambda: store.contains(KEYS[0]),
        lambda: store.contains_many(KEYS),
        lambda: store.count_prefix(KEYS),
    ]
    for call in calls:
        with pytest.raises(kind):
            call()
    assert store.put(_key(7), b"z")  # writes are not hit
    store.delete(_key(7))
    assert sum(store.injected.values()) == len(calls)


def test_error_on_writes_raises_from_every_write(
    store: FaultyStore, inner: KVStore, control: Path
) -> None:
    write_control(control, fault="error", on="writes")
    for call in (
        lambda: store.put(_key(5), b"a"),
        lambda: store.put_many([(_key(5), b"a")]),
        lambda: store.delete(KEYS[0]),
        store.clear,
    ):
        with pytest.raises(StoreError):
            call()
    assert not inner.contains(_key(5))
    assert inner.contains(KEYS[0])
    assert _reads(store) == _reads(inner)  # reads are not hit


def test_groups_narrow_a_fault_to_gets(store: FaultyStore, control: Path) -> None:
    write_control(control, fault="error", on=["get"])
    assert store.count_prefix(KEYS) == 3  # the lookup says present ...
    with pytest.raises(StoreError):
        store.get_many(KEYS)  # ... the load fails


def test_latency_delays_each_call_and_keeps_values(
    store: FaultyStore, inner: KVStore, control: Path
) -> None:
    write_control(control, fault="latency", ms=30, on="reads")
    started = time.perf_counter()
    assert store.get(KEYS[1]) == inner.get(KEYS[1])
    assert store.count_prefix(KEYS) == 3
    assert time.perf_counter() - started >= 0.06
    assert store.injected == {"latency:get": 1, "latency:count_prefix": 1}


def test_corrupt_flips_the_middle_byte(store: FaultyStore, inner: KVStore, control: Path) -> None:
    write_control(control, fault="corrupt")
    good, bad = inner.get(KEYS[1]), store.get(KEYS[1])
    assert good is not None and bad is not None and len(bad) == len(good)
    assert [i for i in range(len(good)) if good[i] != bad[i]] == [len(good) // 2]
    with pytest.raises(CorruptEntry):
        codec.decode(bad, NS, KEYS[1])
    assert inner.get(KEYS[1]) == good  # the stored bytes are untouched
    assert store.get(_key(99)) is None  # an absent key stays absent


def test_truncate_returns_a_prefix(store: FaultyStore, inner: KVStore, control: Path) -> None:
    write_control(control, fault="truncate", keep=0.25)
    good = inner.get(KEYS[0])
    values = store.get_many(KEYS)
    assert good is not None and values[0] == good[: len(good) // 4]
    for key, value in zip(KEYS, values, strict=True):
        with pytest.raises(CorruptEntry):
            codec.decode(value or b"", NS, key)


def test_enospc_refuses_writes_as_the_disk_store_would(
    store: FaultyStore, inner: KVStore, control: Path
) -> None:
    write_control(control, fault="enospc")
    with pytest.raises(StoreError) as caught:
        store.put_many([(_key(6), b"b"), (_key(7), b"c")])
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC
    assert not inner.contains(_key(6)) and not inner.contains(_key(7))
    assert store.get(KEYS[0]) == inner.get(KEYS[0])  # reads and deletes are not hit
    store.delete(KEYS[2])


def test_evict_between_lookup_and_load(store: FaultyStore, inner: KVStore, control: Path) -> None:
    write_control(control, fault="evict")
    assert store.count_prefix(KEYS) == 3 and store.contains(KEYS[0])
    assert store.get_many(KEYS[:2]) == [None, None]
    assert not inner.contains(KEYS[0]) and not inner.contains(KEYS[1])  # really gone
    assert store.count_prefix(KEYS) == 0
    assert inner.contains(KEYS[2])


def test_a_fraction_of_calls_seeded_and_repeatable(store: FaultyStore, control: Path) -> None:
    def outcomes() -> list[bool]:
        failed = []
        for _ in range(200):
            try:
                store.contains(KEYS[0])
                failed.append(False)
            except StoreError:
                failed.append(True)
        return failed

    write_control(control, fault="error", fraction=0.3, seed=7)
    first = outcomes()
    write_control(control, fault="error", fraction=0.3, seed=7)  # re-read: draws restart
    assert outcomes() == first
    assert 30 <= sum(first) <= 90
    write_control(control, fault="error", fraction=0.3, seed=8)
    assert outcomes() != first


def test_value_faults_are_drawn_per_value(
    store: FaultyStore, inner: KVStore, control: Path
) -> None:
    write_control(control, fault="corrupt", fraction=0.5, seed=1)
    good = inner.get_many(KEYS)
    spoiled = [[a != b for a, b in zip(store.get_many(KEYS), good, strict=True)] for _ in range(20)]
    assert any(0 < sum(call) < len(KEYS) for call in spoiled)  # some values of one call
    assert store.injected["corrupt:get_many"] == sum(map(sum, spoiled))
    write_control(control, fault="corrupt")  # every value
    got = store.get_into(KEYS[0], bytearray(4096))
    assert got is not None and bytes(got) != good[0] and store.injected["corrupt:get_into"] == 1


def test_control_changes_are_seen_at_once(store: FaultyStore, control: Path) -> None:
    for _ in range(3):  # several rewrites within one mtime tick: a new inode each time
        write_control(control, fault="error", on="reads")
        with pytest.raises(StoreError):
            store.get(KEYS[0])
        write_control(control, fault="none")
        assert store.get(KEYS[0]) is not None
    control.unlink()
    assert store.get(KEYS[0]) is not None


def test_record_names_every_injected_fault(
    store: FaultyStore, control: Path, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    write_control(control, fault="error", on=["get"], phase="p1", record=str(record))
    with pytest.raises(StoreError):
        store.get_many(KEYS)
    write_control(control, fault="evict", phase="p2", record=str(record))
    store.get_many(KEYS[:2])
    lines = read_record(record)
    assert {line.pop("store") for line in lines} == {"inner"}
    assert lines == [
        {"phase": "p1", "fault": "error", "method": "get_many", "keys": 3, "raised": True},
        {"phase": "p2", "fault": "evict", "method": "get_many", "keys": 1, "raised": False},
        {"phase": "p2", "fault": "evict", "method": "get_many", "keys": 1, "raised": False},
    ]


@pytest.mark.parametrize(
    "raw",
    [
        {"fault": "explode"},
        {"fault": "error", "on": "sometimes"},
        {"fault": "error", "on": ["get", "scan"]},
        {"fault": "error", "error": "oops"},
        {"fault": "error", "fraction": 1.5},
        {"fault": "truncate", "keep": 1.0},
        {"fault": "error", "colour": "red"},
    ],
)
def test_bad_control_is_refused(raw: dict[str, object], control: Path) -> None:
    with pytest.raises(ValueError):
        write_control(control, **raw)
    assert not control.exists()


def test_spec_round_trips_through_json() -> None:
    spec = FaultSpec.parse({"fault": "latency", "on": "writes", "ms": 5, "phase": "x"})
    assert FaultSpec.parse(spec.to_json()) == spec
    assert spec.hits("put") and not spec.hits("get")
    assert not FaultSpec.parse({"fault": "enospc", "on": "reads"}).hits("get")


def test_thread_safe_while_the_control_flips(store: FaultyStore, control: Path) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def hammer(offset: int) -> None:
        try:
            while not stop.is_set():
                for i in range(3):
                    try:
                        store.put(_key(100 + offset * 10 + i), b"v" * 64)
                        store.get_many(KEYS)
                        store.count_prefix(KEYS)
                    except StoreError:
                        pass
        except BaseException as exc:  # anything but a StoreError is a bug of the tool
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for n in range(30):
        fault = ("error", "corrupt", "none", "truncate")[n % 4]
        write_control(control, fault=fault, fraction=0.5, seed=n)
        time.sleep(0.005)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    assert os.path.exists(control)
