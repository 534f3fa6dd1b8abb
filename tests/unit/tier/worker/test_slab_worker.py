"""kvmux.tier.worker.slab_worker: the memory tier's slots, kept in step with its index."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kvmux.keys import BlockKey, block_keys, namespace_id  # noqa: E402
from kvmux.metrics import TierStats  # noqa: E402
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, TierStepPlan  # noqa: E402
from kvmux.tier.worker import slab_worker  # noqa: E402
from kvmux.tier.worker.slab import HostSlab  # noqa: E402
from kvmux.tier.worker.slab_worker import SlabWorker  # noqa: E402

NUM_BLOCKS = 8
NS = namespace_id({"m": "slab"})
KEYS = block_keys(NS, list(range(6 * 16)), 16)
BLOCK_BYTES = 2 * (2 * 4 * 8 * 4)  # two float32 layers of [2, 4, 8] per block


def _caches(random: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    shape = (NUM_BLOCKS, 2, 4, 8)
    if random:
        return {f"layer.{i}": torch.randn(shape, generator=generator) for i in range(2)}
    return {f"layer.{i}": torch.zeros(shape) for i in range(2)}


class _Made(list[SlabWorker]):
    """The workers a test made, and whether they copy loads layer by layer."""

    def __init__(self, by_layer: bool):
        super().__init__()
        self.by_layer = by_layer


@pytest.fixture(params=[False, True], ids=["whole", "by-layer"])
def workers(request: pytest.FixtureRequest) -> Iterator[_Made]:
    made = _Made(request.param)
    yield made
    for worker in made:
        worker.close()


def _worker(made: list[SlabWorker], caches: dict[str, Any], slots: int = 4) -> SlabWorker:
    by_layer = made.by_layer if isinstance(made, _Made) else False
    worker = SlabWorker("memory", slots, 0, TierStats(), by_layer=by_layer)
    worker.register(caches, NUM_BLOCKS)
    made.append(worker)
    return worker


def _by_layer_worker(made: list[SlabWorker], caches: dict[str, Any], slots: int) -> SlabWorker:
    """A worker that copies loads layer by layer, whatever the fixture's mode."""
    worker = SlabWorker("memory", slots, 0, TierStats(), by_layer=True)
    worker.register(caches, NUM_BLOCKS)
    made.append(worker)
    return worker


def _load(worker: SlabWorker, loads: list[BlockTransfer]) -> None:
    """A step's load as the forward pass sees it: each layer waited for before it runs."""
    worker.load(loads)
    for layer in ("layer.0", "layer.1"):
        worker.wait_layer(layer)


def _save(worker: SlabWorker, *pairs: tuple[BlockKey, int], evict: Sequence[BlockKey] = ()) -> None:
    worker.save(TierStepPlan(saves=[BlockTransfer(k, b) for k, b in pairs], evictions=list(evict)))


def _same(a: dict[str, Any], block_a: int, b: dict[str, Any], block_b: int) -> bool:
    return all(
        torch.equal(x[block_a], y[block_b]) for x, y in zip(a.values(), b.values(), strict=True)
    )


def test_save_then_load_into_other_blocks(workers: list[SlabWorker]) -> None:
    caches = _caches(random=True)
    original = {name: t.clone() for name, t in caches.items()}
    worker = _worker(workers, caches)
    _save(worker, (KEYS[0], 1), (KEYS[1], 3))
    _load(worker, [BlockTransfer(KEYS[0], 6), BlockTransfer(KEYS[1], 7)])
    assert worker.take_load_errors() == set() and worker.take_missing() == set()
    assert _same(caches, 6, original, 1) and _same(caches, 7, original, 3)
    stats = worker._stats
    assert (stats.saved_blocks, stats.loaded_blocks) == (2, 2)
    assert stats.bytes_saved == stats.bytes_loaded == 2 * BLOCK_BYTES
    assert stats.stored_bytes == 2 * BLOCK_BYTES


def test_a_key_not_held_is_a_counted_miss(workers: list[SlabWorker]) -> None:
    worker = _worker(workers, _caches(random=True))
    _save(worker, (KEYS[0], 1))
    _load(worker, [BlockTransfer(KEYS[0], 5), BlockTransfer(KEYS[2], 6)])
    assert worker.take_load_errors() == {6}
    assert worker.take_missing() == {KEYS[2]}
    assert worker._stats.load_errors == 1


def test_planned_evictions_free_slots_for_the_next_saves(workers: list[SlabWorker]) -> None:
    caches = _caches(random=True)
    worker = _worker(workers, caches, slots=2)
    _save(worker, (KEYS[0], 0), (KEYS[1], 1))
    _save(worker, (KEYS[2], 2), (KEYS[3], 3), evict=[KEYS[0], KEYS[1]])
    assert worker.take_missing() == set()  # the scheduler evicted: nothing to report
    _load(worker, [BlockTransfer(KEYS[0], 4)])
    assert worker.take_missing() == {KEYS[0]}
    original = {name: t.clone() for name, t in caches.items()}
    _load(worker, [BlockTransfer(KEYS[2], 5), BlockTransfer(KEYS[3], 6)])
    assert _same(caches, 5, original, 2) and _same(caches, 6, original, 3)


def test_out_of_slots_the_least_recently_used_go_and_are_reported(
    workers: list[SlabWorker],
) -> None:
    worker = _worker(workers, _caches(random=True), slots=2)
    _save(worker, (KEYS[0], 0), (KEYS[1], 1))
    _load(worker, [BlockTransfer(KEYS[0], 4)])  # KEYS[0] is now the most recently used
    _save(worker, (KEYS[2], 2))  # the index did not evict: the worker makes room itself
    assert worker.take_missing() == {KEYS[1]}
    _load(worker, [BlockTransfer(KEYS[0], 5), BlockTransfer(KEYS[2], 6)])
    assert worker.take_load_errors() == set()


def test_a_slot_whose_tag_differs_is_never_loaded(workers: list[SlabWorker]) -> None:
    caches = _caches(random=True)
    worker = _worker(workers, caches)
    _save(worker, (KEYS[0], 1), (KEYS[1], 2))
    slot = worker._slot_of[KEYS[0]]
    worker._tags[slot] = KEYS[1]  # the bookkeeping gone wrong: the slot claims another key
    before = caches["layer.0"][5].clone()
    _load(worker, [BlockTransfer(KEYS[0], 5)])
    assert worker.take_load_errors() == {5}
    assert torch.equal(caches["layer.0"][5], before)


def test_a_key_saved_twice_takes_one_slot(workers: list[SlabWorker]) -> None:
    worker = _worker(workers, _caches(random=True))
    _save(worker, (KEYS[0], 1), (KEYS[0], 1))
    _save(worker, (KEYS[0], 1))
    assert len(worker._slot_of) == 1 and worker._stats.saved_blocks == 1


class _Broken(HostSlab):
    def load(self, group: int, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        raise RuntimeError("copy-in broke")

    def save(self, group: int, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        raise RuntimeError("copy-out broke")


def _broken_copy(*_: Any) -> None:
    raise RuntimeError("copy-in broke")


def test_failed_copies_are_misses_never_crashes(
    workers: list[SlabWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _worker(workers, _caches(random=True))
    _save(worker, (KEYS[0], 1))
    assert worker._slab is not None
    worker._slab.__class__ = _Broken
    monkeypatch.setattr(slab_worker, "copy_slots_in", _broken_copy)  # the layer copies
    _load(worker, [BlockTransfer(KEYS[0], 5)])
    assert worker.take_load_errors() == {5}
    _save(worker, (KEYS[1], 2))
    assert worker.take_missing() == {KEYS[0], KEYS[1]}
    stats = worker._stats
    assert (stats.load_errors, stats.save_errors, stats.store_errors) == (1, 1, 2)
    assert len(worker._free) == 4  # the failed load's and the failed save's slots are free


def test_saves_computed_over_a_failed_load_are_dropped(workers: list[SlabWorker]) -> None:
    worker = _worker(workers, _caches(random=True))
    _load(worker, [BlockTransfer(KEYS[0], 0)])  # not held: block 0 failed
    plan = TierStepPlan(saves=[BlockTransfer(KEYS[1], 1)], tables={"r": [0, 1]})
    worker.save(plan)
    assert KEYS[1] not in worker._slot_of
    assert worker._stats.tainted_saves == 1


def test_an_asynchronous_load_lands_and_is_reported_once(workers: list[SlabWorker]) -> None:
    caches = _caches(random=True)
    original = {name: t.clone() for name, t in caches.items()}
    worker = _worker(workers, caches)
    _save(worker, (KEYS[0], 1), (KEYS[1], 2))
    load = RequestLoad("r", 0, ((BlockTransfer(KEYS[0], 5),), (BlockTransfer(KEYS[1], 6),)))
    worker.start_loads([load])
    deadline = time.monotonic() + 30
    finished: set[str] = set()
    while not finished and time.monotonic() < deadline:
        report = worker.finished_loads()
        finished = report.finished
        assert report.failed == {}
        time.sleep(0.01)
    assert finished == {"r"}
    assert _same(caches, 5, original, 1) and _same(caches, 6, original, 2)
    assert worker.finished_loads().finished == set()


def test_clear_forgets_every_block(workers: list[SlabWorker]) -> None:
    worker = _worker(workers, _caches(random=True))
    _save(worker, (KEYS[0], 1), (KEYS[1], 2))
    worker.clear()
    _load(worker, [BlockTransfer(KEYS[0], 5)])
    assert worker.take_load_errors() == {5}
    assert len(worker._free) == 4


def test_layer_copies_wait_for_nothing_but_their_layer(workers: list[SlabWorker]) -> None:
    caches = _caches(random=True)
    original = {name: t.clone() for name, t in caches.items()}
    worker = _by_layer_worker(workers, caches, slots=4)
    _save(worker, (KEYS[0], 1))
    worker.load([BlockTransfer(KEYS[0], 6)])
    worker.wait_layer("layer.0")
    assert torch.equal(caches["layer.0"][6], original["layer.0"][1])
    worker.wait_layer("layer.1")
    worker.wait_layer("layer.9")  # a layer with nothing to load: no wait
    assert worker.take_load_errors() == set()
    assert _same(caches, 6, original, 1)
    assert worker._stats.loaded_blocks == 1


def test_a_layer_never_waited_for_is_recomputed_and_loads_go_whole(
    workers: list[SlabWorker],
) -> None:
    caches = _caches(random=True)
    original = {name: t.clone() for name, t in caches.items()}
    worker = _by_layer_worker(workers, caches, slots=4)
    _save(worker, (KEYS[0], 1))
    worker.load([BlockTransfer(KEYS[0], 6)])
    worker.wait_layer("layer.0")  # the forward pass skipped layer.1's hook
    assert worker.take_load_errors() == {6}  # it may have read layer.1 first: recomputed
    assert worker.take_missing() == set()  # the slot still holds the block
    assert worker._stats.load_errors == 1
    worker.load([BlockTransfer(KEYS[0], 7)])  # copied whole, before the forward pass
    assert worker.take_load_errors() == set()
    assert _same(caches, 7, original, 1)


def test_a_slot_reused_after_a_layered_load_leaves_the_loaded_block(
    workers: list[SlabWorker],
) -> None:
    caches = _caches(random=True)
    original = {name: t.clone() for name, t in caches.items()}
    worker = _by_layer_worker(workers, caches, slots=1)
    _save(worker, (KEYS[0], 1))
    _load(worker, [BlockTransfer(KEYS[0], 6)])
    _save(worker, (KEYS[1], 2), evict=[KEYS[0]])  # reuses the only slot
    assert _same(caches, 6, original, 1)
    assert worker.take_load_errors() == set()


def test_layer_order_follows_the_cache_and_numbers_each_group(workers: list[SlabWorker]) -> None:
    names = ["a.0", "b.0", "a.1", "b.1"]
    assert slab_worker._layer_order(names, None) == [(n, 0, i) for i, n in enumerate(names)]
    assert slab_worker._layer_order(names, [["a.0", "a.1"], ["b.0", "b.1"]]) == [
        ("a.0", 0, 0),
        ("b.0", 1, 0),
        ("a.1", 0, 1),
        ("b.1", 1, 1),
    ]


def test_loads_go_by_layer_where_a_spare_core_runs_them(
    workers: list[SlabWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    for spare in (False, True):
        monkeypatch.setattr(slab_worker, "has_spare_core", lambda spare=spare: spare)
        worker = SlabWorker("memory", 4, 0, TierStats())  # decided at register
        workers.append(worker)
        assert not worker.copies_by_layer
        worker.register(_caches(random=False), NUM_BLOCKS)
        assert worker.copies_by_layer is spare


def test_a_save_in_flight_holds_back_only_the_step_that_reuses_its_blocks(
    workers: list[SlabWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU a save returns while its copies run; on the host nothing stays in flight."""
    worker = _worker(workers, _caches(random=True))
    slab, ordered = worker._slab, []
    assert slab is not None
    worker.save(TierStepPlan(saves=[BlockTransfer(KEYS[0], 1)], step=1))
    assert not worker._in_flight  # the host's copies are done when save returns
    copy = slab.save

    def in_flight(*args: Any) -> Any:
        copy(*args)
        return SimpleNamespace(order=lambda streams: ordered.append(("step 2", *streams)))

    monkeypatch.setattr(slab, "save", in_flight)
    assert worker._copies is not None  # on a GPU: the forward stream and the loader's
    monkeypatch.setattr(worker._copies, "writers", lambda: ["forward", "loader"])
    worker.save(TierStepPlan(saves=[BlockTransfer(KEYS[1], 2)], step=2))
    worker.fence(TierStepPlan(step=3))  # no block of step 2's save is reused
    assert ordered == []
    worker.fence(TierStepPlan(step=3, fence=2))
    assert ordered == [("step 2", "forward", "loader")] and not worker._in_flight
