"""kvmux.tier.worker.store_worker: saves through the writer thread, loads back, errors as misses."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kvmux import codec  # noqa: E402
from kvmux.codec import SigningKeys  # noqa: E402
from kvmux.errors import StoreError  # noqa: E402
from kvmux.keys import BlockKey, block_keys, namespace_id, store_key  # noqa: E402
from kvmux.metrics import TierStats  # noqa: E402
from kvmux.stores import DictStore, DiskStore, KVStore  # noqa: E402
from kvmux.tier.scheduler.index import SharedStoreView  # noqa: E402
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan  # noqa: E402
from kvmux.tier.worker.store_worker import StoreWorker  # noqa: E402

NUM_BLOCKS = 6
NS = namespace_id({"m": "x"})
LAYOUTS = {"blocks_first": ((NUM_BLOCKS, 2, 4, 8), 0), "blocks_second": ((2, NUM_BLOCKS, 4, 8), 1)}
KEYS = block_keys(NS, list(range(4 * 16)), 16)
K1, K3, K_OTHER, K_UNKNOWN = KEYS

MakeWorker = Callable[..., StoreWorker]


def _caches(layout: str, random: bool) -> dict[str, torch.Tensor]:
    shape, _ = LAYOUTS[layout]
    generator = torch.Generator().manual_seed(1234)
    if random:
        return {f"layer.{i}": torch.randn(shape, generator=generator) for i in range(2)}
    return {f"layer.{i}": torch.zeros(shape) for i in range(2)}


def _block(tensor: torch.Tensor, layout: str, block_id: int) -> torch.Tensor:
    return tensor.select(LAYOUTS[layout][1], block_id)


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_worker() -> Iterator[MakeWorker]:
    workers: list[StoreWorker] = []

    def make(
        store: KVStore,
        caches: dict[str, torch.Tensor] | None,
        namespace: bytes = NS,
        stats: TierStats | None = None,
        save_queue: int | None = None,
    ) -> StoreWorker:
        stats = stats if stats is not None else TierStats()
        worker = StoreWorker(store, namespace, 0, stats, save_queue=save_queue)
        if caches is not None:
            worker.register(caches, NUM_BLOCKS)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def _save(worker: StoreWorker, *transfers: tuple[BlockKey, int]) -> None:
    worker.save(TierStepPlan(saves=[BlockTransfer(k, b) for k, b in transfers]))
    worker.flush()


def test_save_then_load_into_other_blocks(layout: str, make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    source = _caches(layout, random=True)
    save_stats, load_stats = TierStats(), TierStats()
    saver = make_worker(store, source, stats=save_stats)
    _save(saver, (K1, 1), (K3, 3))
    assert store.contains(store_key(K1, 0))
    assert store.contains(store_key(K3, 0))
    assert len(store) == 2
    assert save_stats.saved_blocks == 2
    assert save_stats.save_errors == 0
    assert save_stats.bytes_saved == store.used_bytes()

    target = _caches(layout, random=False)
    loader = make_worker(store, target, stats=load_stats)
    loader.load([BlockTransfer(K1, 4), BlockTransfer(K3, 5)])
    assert loader.take_load_errors() == set()
    assert loader.take_missing() == set()
    for src, dst in zip(source.values(), target.values(), strict=True):
        assert torch.equal(_block(dst, layout, 4), _block(src, layout, 1))
        assert torch.equal(_block(dst, layout, 5), _block(src, layout, 3))
        for untouched in range(4):
            assert not _block(dst, layout, untouched).any()
    assert load_stats.loaded_blocks == 2
    assert load_stats.load_errors == 0
    assert load_stats.bytes_loaded == store.used_bytes()


def test_stored_entries_are_codec_entries_under_shard_keys(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    source = _caches("blocks_first", random=True)
    worker = make_worker(store, source)
    _save(worker, (K1, 2))
    assert not store.contains(store_key(K1, 1))  # one shard: the whole block
    data = store.get(store_key(K1, 0))
    assert data is not None
    entry = codec.decode(data, NS, store_key(K1, 0))
    layer0 = entry.payload[: entry.layers[0].nbytes]
    assert bytes(layer0) == source["layer.0"][2].numpy().tobytes()


def test_save_copies_out_before_returning(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    source = _caches("blocks_first", random=True)
    expected = source["layer.0"][1].clone()
    worker = make_worker(store, source)
    worker.save(TierStepPlan(saves=[BlockTransfer(K1, 1)]))
    for tensor in source.values():
        tensor.zero_()  # the engine reuses the block right after the step
    worker.flush()
    target = _caches("blocks_first", random=False)
    loader = make_worker(store, target)
    loader.load([BlockTransfer(K1, 0)])
    assert torch.equal(target["layer.0"][0], expected)


def test_load_waits_for_a_pending_save_of_the_same_key(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    caches = _caches("blocks_first", random=True)
    expected = caches["layer.1"][3].clone()
    worker = make_worker(store, caches)
    worker.save(TierStepPlan(saves=[BlockTransfer(K3, 3)]))  # no flush
    worker.load([BlockTransfer(K3, 0)])
    assert worker.take_load_errors() == set()
    assert torch.equal(caches["layer.1"][0], expected)


def test_corrupt_entry_is_a_load_error(layout: str, make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    source = _caches(layout, random=True)
    stats = TierStats()
    saver = make_worker(store, source)
    _save(saver, (K1, 1), (K3, 3))
    skey = store_key(K1, 0)
    data = bytearray(store.get(skey) or b"")
    data[len(data) // 2] ^= 0xFF
    store.put(skey, bytes(data))

    target = _caches(layout, random=False)
    loader = make_worker(store, target, stats=stats)
    loader.load([BlockTransfer(K1, 4), BlockTransfer(K3, 5)])
    assert loader.take_load_errors() == {4}
    assert loader.take_missing() == {K1}
    assert loader.take_load_errors() == set()
    assert loader.take_missing() == set()
    for src, dst in zip(source.values(), target.values(), strict=True):
        assert torch.equal(_block(dst, layout, 5), _block(src, layout, 3))
        assert not _block(dst, layout, 4).any()
    assert not store.contains(skey)  # the bad entry is dropped
    assert store.contains(store_key(K3, 0))
    assert (stats.loaded_blocks, stats.load_errors) == (1, 1)


def test_disk_reads_reuse_buffers_and_never_load_a_stale_tail(
    tmp_path: Path, make_worker: MakeWorker
) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    source = _caches("blocks_first", random=True)
    _save(make_worker(store, source), (K1, 1), (K3, 3))
    target = _caches("blocks_first", random=False)
    loader = make_worker(store, target)
    loader.load([BlockTransfer(K1, 4), BlockTransfer(K3, 5)])
    assert loader.take_load_errors() == set()
    lent = list(loader._read_buffers._free)
    assert len(lent) == 2  # read into buffers that were then taken back
    # K1's entry cut short: the buffer still holds its old tail, which must not load
    skey = store_key(K1, 0)
    path = store._path(skey)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    loader.load([BlockTransfer(K1, 2), BlockTransfer(K3, 0)])
    assert loader.take_load_errors() == {2}
    assert not target["layer.0"][2].any()
    for src, dst in zip(source.values(), target.values(), strict=True):
        assert torch.equal(dst[4], src[1]) and torch.equal(dst[5], src[3])
        assert torch.equal(dst[0], src[3])
    assert all(any(b is old for old in lent) for b in loader._read_buffers._free)


def test_missing_key_is_a_load_error(layout: str, make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    source = _caches(layout, random=True)
    saver = make_worker(store, source)
    _save(saver, (K1, 1))
    stats = TierStats()
    target = _caches(layout, random=False)
    loader = make_worker(store, target, stats=stats)
    loader.load([BlockTransfer(K1, 4), BlockTransfer(K_UNKNOWN, 2)])
    assert loader.take_load_errors() == {2}
    assert loader.take_missing() == {K_UNKNOWN}
    for src, dst in zip(source.values(), target.values(), strict=True):
        assert torch.equal(_block(dst, layout, 4), _block(src, layout, 1))
    assert (stats.loaded_blocks, stats.load_errors) == (1, 1)


def test_errors_accumulate_until_taken(make_worker: MakeWorker) -> None:
    worker = make_worker(DictStore(1 << 20), _caches("blocks_first", random=False))
    worker.load([BlockTransfer(K1, 1)])
    worker.load([BlockTransfer(K3, 2)])
    assert worker.take_load_errors() == {1, 2}
    assert worker.take_missing() == {K1, K3}


def test_entry_from_another_namespace_is_a_load_error(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    _save(make_worker(store, _caches("blocks_first", random=True)), (K1, 1))
    loader = make_worker(store, _caches("blocks_first", random=False), namespace_id({"m": "y"}))
    loader.load([BlockTransfer(K1, 0)])
    assert loader.take_load_errors() == {0}
    assert not store.contains(store_key(K1, 0))


def test_entry_of_another_cache_layout_is_a_load_error(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    _save(make_worker(store, _caches("blocks_first", random=True)), (K1, 1))
    narrow = {f"layer.{i}": torch.zeros(NUM_BLOCKS, 2, 4, 4) for i in range(2)}
    loader = make_worker(store, narrow)
    loader.load([BlockTransfer(K1, 0)])
    assert loader.take_load_errors() == {0}
    assert not narrow["layer.0"].any()


def test_evictions_delete_entries(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    worker = make_worker(store, _caches("blocks_first", random=True))
    _save(worker, (K1, 1), (K3, 3))
    worker.save(TierStepPlan(saves=[BlockTransfer(K_OTHER, 0)], evictions=[K1]))
    worker.flush()
    assert not store.contains(store_key(K1, 0))
    assert store.contains(store_key(K3, 0))
    assert store.contains(store_key(K_OTHER, 0))
    worker.save(TierStepPlan(evictions=[K3]))  # evictions alone
    worker.flush()
    assert not store.contains(store_key(K3, 0))


def test_entry_too_large_for_the_store_is_a_save_error(make_worker: MakeWorker) -> None:
    stats = TierStats()
    store = DictStore(100)
    worker = make_worker(store, _caches("blocks_first", random=True), stats=stats)
    _save(worker, (K1, 1))
    assert (stats.saved_blocks, stats.save_errors, stats.bytes_saved) == (0, 1, 0)
    assert len(store) == 0


class _BrokenStore(DictStore):
    def put(self, key: bytes, value: bytes) -> bool:
        raise StoreError("write refused")

    def get(self, key: bytes) -> bytes | None:
        raise StoreError("read refused")

    def delete(self, key: bytes) -> None:
        raise StoreError("delete refused")


def test_store_errors_are_misses_not_crashes(make_worker: MakeWorker) -> None:
    stats = TierStats()
    worker = make_worker(
        _BrokenStore(1 << 20, name="broken"), _caches("blocks_first", True), stats=stats
    )
    worker.save(TierStepPlan(saves=[BlockTransfer(K1, 1)], evictions=[K3]))
    worker.flush()
    assert stats.save_errors == 1
    assert stats.saved_blocks == 0
    worker.load([BlockTransfer(K1, 0)])
    assert worker.take_load_errors() == {0}
    assert worker.take_missing() == {K1}
    assert stats.load_errors == 1
    assert stats.store_errors == 3  # the failed eviction, the failed write and the failed read


def test_unregistered_worker_does_nothing(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    worker = make_worker(store, None)
    worker.save(TierStepPlan(saves=[BlockTransfer(K1, 1)]))
    worker.load([BlockTransfer(K1, 1)])
    worker.flush()
    assert len(store) == 0
    assert worker.take_load_errors() == set()
    assert worker.store is store


def test_empty_plans_do_nothing(make_worker: MakeWorker) -> None:
    stats = TierStats()
    worker = make_worker(DictStore(1 << 20), _caches("blocks_first", True), stats=stats)
    worker.save(TierStepPlan())
    worker.load([])
    worker.flush()
    assert stats.snapshot() == TierStats().snapshot()


def test_load_stats_count_only_this_calls_failures(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    _save(make_worker(store, _caches("blocks_first", random=True)), (K1, 1))
    stats = TierStats()
    loader = make_worker(store, _caches("blocks_first", random=False), stats=stats)
    loader.load([BlockTransfer(K_UNKNOWN, 4)])  # fails; errors not taken yet
    loader.load([BlockTransfer(K1, 4)])  # succeeds into the same block
    assert (stats.loaded_blocks, stats.load_errors) == (1, 1)


# -- nothing computed over a failed load is saved -----------------------------------


def test_a_failed_load_taints_the_later_blocks_of_its_request(make_worker: MakeWorker) -> None:
    """Block 1 fails to load: blocks 2 and 3, computed over it, are not saved; block 0 is."""
    store = DictStore(1 << 20)
    stats = TierStats()
    worker = make_worker(store, _caches("blocks_first", random=True), stats=stats)
    worker.load([BlockTransfer(K_UNKNOWN, 1)])  # missing from the store: a failed load
    plan = TierStepPlan(
        saves=[BlockTransfer(K1, 0), BlockTransfer(K3, 2), BlockTransfer(K_OTHER, 3)],
        tables={"r": [0, 1, 2, 3], "other": [4, 5]},
    )
    worker.save(plan)
    worker.flush()
    assert store.contains(store_key(K1, 0))
    assert not store.contains(store_key(K3, 0))
    assert not store.contains(store_key(K_OTHER, 0))
    assert stats.tainted_saves == 2
    assert worker.take_missing() == {K_UNKNOWN, K3, K_OTHER}  # the scheduler forgets them
    assert worker.take_load_errors() == {1}


def test_failures_do_not_outlive_their_step(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    worker = make_worker(store, _caches("blocks_first", random=True))
    worker.load([BlockTransfer(K_UNKNOWN, 1)])
    worker.save(TierStepPlan())  # the failing step ends
    worker.load([])  # the next step: block 1 now holds recomputed KV
    worker.save(TierStepPlan(saves=[BlockTransfer(K3, 2)], tables={"r": [0, 1, 2]}))
    worker.flush()
    assert store.contains(store_key(K3, 0))


def test_a_sibling_failure_taints_saves_too(make_worker: MakeWorker) -> None:
    """MuxConnector passes on blocks another child failed to load, before the save."""
    store = DictStore(1 << 20)
    worker = make_worker(store, _caches("blocks_first", random=True))
    worker.load([])
    worker.drop_saves_over({2})
    worker.save(
        TierStepPlan(
            saves=[BlockTransfer(K1, 1), BlockTransfer(K3, 2), BlockTransfer(K_OTHER, 3)],
            tables={"r": [1, 2, 3]},
        )
    )
    worker.flush()
    assert store.contains(store_key(K1, 0))
    assert not store.contains(store_key(K3, 0))
    assert not store.contains(store_key(K_OTHER, 0))


def test_a_load_failed_on_another_rank_taints_this_ranks_saves(make_worker: MakeWorker) -> None:
    """Tensor parallelism: block 1 landed here but not on the other rank; the all-reduce
    spread that, so this rank reports it failed and saves nothing computed over it."""
    store = DictStore(1 << 20)
    _save(make_worker(store, _caches("blocks_first", random=True)), (K1, 1))
    worker = make_worker(store, _caches("blocks_first", random=True))
    asked: list[list[bool]] = []

    def other_rank_failed_the_first(landed: Sequence[bool]) -> list[bool]:
        asked.append(list(landed))
        return [False, *landed[1:]]

    worker.agree_with_ranks(other_rank_failed_the_first)
    worker.load([BlockTransfer(K1, 1)])
    assert asked == [[True]] and worker.take_load_errors() == {1}
    worker.save(TierStepPlan(saves=[BlockTransfer(K3, 2)], tables={"r": [1, 2]}))
    worker.flush()
    assert not store.contains(store_key(K3, 0))


def test_a_rank_whose_load_raises_still_agrees(make_worker: MakeWorker) -> None:
    """The other ranks wait in the collective: a load that raises joins it first."""
    worker = make_worker(DictStore(1 << 20), _caches("blocks_first", random=True))
    asked: list[list[bool]] = []
    worker.agree_with_ranks(lambda landed: asked.append(list(landed)) or list(landed))

    def broken(transfers: Sequence[BlockTransfer]) -> list[bool]:
        raise RuntimeError("a bug in a load")

    worker._load_blocks = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        worker.load([BlockTransfer(K1, 1), BlockTransfer(K3, 2)])
    assert asked == [[False, False]] and worker.take_load_errors() == {1, 2}


def test_blocks_computed_over() -> None:
    plan = TierStepPlan(tables={"a": [1, 2, 3, 4], "b": [9, 3, 7], "c": [5, 6]})
    assert plan.blocks_computed_over({3}) == {3, 4, 7}
    assert plan.blocks_computed_over({5, 4}) == {4, 5, 6}
    assert plan.blocks_computed_over(set()) == set()


# -- the save queue is bounded in bytes ------------------------------------------------


class GatedStore(DictStore):
    """A store whose writes wait until the test opens the gate: a store as slow as we like."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.gate = threading.Event()

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        self.gate.wait()
        return super().put_many(items)


def _steps(count: int, per_step: int) -> Iterator[TierStepPlan]:
    keys = block_keys(NS, list(range(count * per_step * 16)), 16)
    for step in range(count):
        chunk = keys[step * per_step : (step + 1) * per_step]
        yield TierStepPlan(saves=[BlockTransfer(k, i) for i, k in enumerate(chunk)])


def test_a_slow_store_never_makes_the_queue_outgrow_its_bound(make_worker: MakeWorker) -> None:
    store = GatedStore(1 << 20)
    stats = TierStats()
    caches = _caches("blocks_first", random=True)
    block_bytes = 2 * 2 * 4 * 8 * 4  # two layers of (2, 4, 8) float32
    worker = StoreWorker(store, NS, 0, stats, save_queue=4 * block_bytes)
    worker.register(caches, NUM_BLOCKS)
    try:
        for plan in _steps(10, 2):
            worker.save(plan)  # returns at once although the store is not writing
        assert stats.dropped_saves == 16
        assert stats.peak_save_queue_bytes == 4 * block_bytes
        assert len(worker.take_missing()) == 16  # the scheduler's index forgets them
        store.gate.set()
        worker.flush()
        assert stats.saved_blocks == 4
        for plan in _steps(2, 2):  # the queue drained: saves are admitted again
            worker.save(plan)
        worker.flush()
        assert stats.dropped_saves == 16
    finally:
        store.gate.set()
        worker.close()


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_peak_memory_under_a_save_heavy_workload_with_a_slow_store() -> None:
    """400 MiB of saves against a store that does not write: memory grows by the bound."""
    bound = 32 * 2**20
    caches = {f"layer.{i}": torch.randn(16, 16, 16, 256) for i in range(4)}  # 1 MiB a block
    store = GatedStore(1 << 30)
    stats = TierStats()
    worker = StoreWorker(store, NS, 0, stats, save_queue=bound)
    worker.register(caches, 16)
    before, peak = _rss_bytes(), 0
    try:
        for plan in _steps(100, 4):
            worker.save(plan)
            peak = max(peak, _rss_bytes())
        growth = peak - before
        print(f"save-heavy, slow store: RSS grew {growth / 2**20:.1f} MiB for 400 MiB of saves")
        assert stats.dropped_saves > 0
        assert stats.peak_save_queue_bytes <= bound
        assert growth < bound + 64 * 2**20
    finally:
        store.gate.set()
        worker.close()


# -- signed entries -------------------------------------------------------------------


def test_signed_saves_load_and_unsigned_entries_do_not(make_worker: MakeWorker) -> None:
    keys = SigningKeys.parse("k1:" + "5a" * 32)
    store = DictStore(1 << 20)
    source = _caches("blocks_first", random=True)
    signer = StoreWorker(store, NS, 0, TierStats(), signing=keys)
    signer.register(source, NUM_BLOCKS)
    unsigned = make_worker(store, source)
    try:
        signer.save(TierStepPlan(saves=[BlockTransfer(K1, 1)]))
        signer.flush()
        _save(unsigned, (K3, 3))  # planted by a writer without the key
        stats = TierStats()
        loader = StoreWorker(store, NS, 0, stats, signing=keys)
        target = _caches("blocks_first", random=False)
        loader.register(target, NUM_BLOCKS)
        loader.load([BlockTransfer(K1, 4), BlockTransfer(K3, 5)])
        assert loader.take_load_errors() == {5}
        assert stats.unverified_entries == 1
        assert store.contains(store_key(K3, 0))  # not deleted: it may be another holder's
        for src, dst in zip(source.values(), target.values(), strict=True):
            assert torch.equal(dst[4], src[1])
            assert not dst[5].any()
        loader.close()
    finally:
        signer.close()


def test_an_entry_that_did_not_verify_is_written_over_by_the_next_save() -> None:
    """A forged entry costs one miss: the engine's own signed entry replaces it."""
    keys = SigningKeys.parse("k1:" + "5a" * 32)
    other = SigningKeys.parse("k1:" + "a5" * 32)
    store = DictStore(1 << 20)
    source = _caches("blocks_first", random=True)
    forger = StoreWorker(store, NS, 0, TierStats(), signing=other)
    forger.register(source, NUM_BLOCKS)
    stats = TierStats()
    worker = StoreWorker(store, NS, 0, stats, signing=keys)
    worker.register(source, NUM_BLOCKS)
    try:
        _save(forger, (K1, 1), (K3, 2))
        worker.load([BlockTransfer(K1, 4)])
        assert worker.take_load_errors() == {4}
        _save(worker, (K1, 1), (K3, 2))  # computed again, saved: K1 replaced, K3 left alone
        assert stats.saved_blocks == 1
        worker.load([BlockTransfer(K1, 5), BlockTransfer(K3, 6)])
        assert worker.take_load_errors() == {6}  # K3 was never read, so it stays the forger's
        for tensor in source.values():
            assert torch.equal(tensor[5], tensor[1])
    finally:
        forger.close()
        worker.close()


class BuggyStore(DictStore):
    """A store with a bug: it raises something that is not a StoreError."""

    def get(self, key: bytes) -> bytes | None:
        raise RuntimeError("a bug in a store")

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        raise RuntimeError("a bug in a store")

    def contains(self, key: bytes) -> bool:
        raise RuntimeError("a bug in a store")


def test_even_a_buggy_store_is_only_a_counted_miss(make_worker: MakeWorker) -> None:
    stats = TierStats()
    worker = make_worker(BuggyStore(1 << 20), _caches("blocks_first", random=True), stats=stats)
    worker.load([BlockTransfer(K1, 1)])
    assert worker.take_load_errors() == {1}
    _save(worker, (K3, 3))
    assert stats.store_errors >= 2
    assert stats.saved_blocks == 0
    view = SharedStoreView(BuggyStore(1 << 20), stats)
    assert view.count_prefix([K1]) == 0


class RefusingStore(DictStore):
    """A full store: every write is refused."""

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        return [False] * len(items)


def test_saves_the_store_refused_are_reported_so_the_index_forgets_them(
    make_worker: MakeWorker,
) -> None:
    stats = TierStats()
    worker = make_worker(RefusingStore(1 << 20), _caches("blocks_first", random=True), stats=stats)
    _save(worker, (K1, 1), (K3, 3))
    assert stats.save_errors == 2
    assert worker.take_missing() == {K1, K3}
    buggy = make_worker(BuggyStore(1 << 20), _caches("blocks_first", random=True))
    _save(buggy, (K1, 1))
    assert buggy.take_missing() == {K1}  # a batch whose store raised, too


BLOCK_BYTES = 2 * 2 * 4 * 8 * 4  # a block of the two (2, 4, 8) float32 layers of _caches


def _save_each(worker: StoreWorker, plans: Iterable[TierStepPlan]) -> None:
    """Save the plans one after the other, each written before the next."""
    for plan in plans:
        worker.save(plan)
        worker.flush()


def test_staging_slots_are_reused_and_each_save_keeps_its_own_bytes(
    layout: str, make_worker: MakeWorker
) -> None:
    caches = _caches(layout, random=True)
    stats = TierStats()
    worker = make_worker(DictStore(1 << 20), caches, stats=stats, save_queue=2 * BLOCK_BYTES)
    saved: dict[BlockKey, list[torch.Tensor]] = {}
    for plan in _steps(6, 2):  # six saves of the same two blocks through two slots
        for tensor in caches.values():
            tensor.normal_()
        for transfer in plan.saves:
            saved[transfer.key] = [
                _block(t, layout, transfer.block_id).clone() for t in caches.values()
            ]
        _save_each(worker, [plan])
    assert (stats.saved_blocks, stats.dropped_saves) == (12, 0)
    for key, expected in saved.items():
        for tensor in caches.values():
            tensor.zero_()
        worker.load([BlockTransfer(key, 4)])
        assert worker.take_load_errors() == set()
        for tensor, block in zip(caches.values(), expected, strict=True):
            assert torch.equal(_block(tensor, layout, 4), block)


def _two_slot_worker(make_worker: MakeWorker, stats: TierStats) -> StoreWorker:
    caches = _caches("blocks_first", random=True)
    return make_worker(DictStore(1 << 20), caches, stats=stats, save_queue=2 * BLOCK_BYTES)


def test_a_failed_write_gives_its_staging_slots_back(
    monkeypatch: pytest.MonkeyPatch, make_worker: MakeWorker
) -> None:
    stats = TierStats()
    worker = _two_slot_worker(make_worker, stats)
    with monkeypatch.context() as patch:
        patch.setattr(worker, "_encode", lambda *_: (_ for _ in ()).throw(ValueError("bug")))
        _save_each(worker, _steps(3, 2))
    assert (stats.save_errors, stats.dropped_saves) == (6, 0)
    _save_each(worker, _steps(2, 2))
    assert (stats.saved_blocks, stats.dropped_saves) == (4, 0)


def test_a_failed_copy_out_gives_its_staging_slots_back(
    monkeypatch: pytest.MonkeyPatch, make_worker: MakeWorker
) -> None:
    stats = TierStats()
    worker = _two_slot_worker(make_worker, stats)
    staging = worker._staging
    assert staging is not None
    with monkeypatch.context() as patch:
        patch.setattr(staging, "save", lambda *_: (_ for _ in ()).throw(RuntimeError("bug")))
        with pytest.raises(RuntimeError, match="bug"):
            worker.save(next(_steps(1, 2)))
    _save_each(worker, _steps(2, 2))
    assert (stats.saved_blocks, stats.dropped_saves) == (4, 0)


def test_a_save_queue_smaller_than_a_block_drops_every_save(make_worker: MakeWorker) -> None:
    stats = TierStats()
    caches = _caches("blocks_first", random=True)
    worker = make_worker(DictStore(1 << 20), caches, stats=stats, save_queue=BLOCK_BYTES - 1)
    _save_each(worker, _steps(1, 2))
    assert (stats.saved_blocks, stats.dropped_saves) == (0, 2)


def test_a_staging_copy_in_flight_holds_back_only_the_step_that_reuses_it(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the copy into staging slots returns at once; a step waits for it only
    where the scheduler says the step overwrites a block the copy reads."""
    worker = make_worker(DictStore(1 << 20), _caches("blocks_first", random=True))
    _save(worker, (K1, 1))
    assert not worker._in_flight  # the host's copies are done when save returns
    staging, ordered = worker._staging, []
    assert staging is not None
    copy = staging.save

    def in_flight(*args: Any) -> Any:
        copy(*args)
        return SimpleNamespace(order=lambda streams: ordered.append("step 4"))

    monkeypatch.setattr(staging, "save", in_flight)
    worker.save(TierStepPlan(saves=[BlockTransfer(K3, 3)], step=4))
    worker.flush()
    worker.fence(TierStepPlan(step=5, fence=3))  # an earlier step's blocks: not in flight
    assert ordered == []
    worker.fence(TierStepPlan(step=5, fence=4))
    assert ordered == ["step 4"] and not worker._in_flight


def test_an_unregistered_rank_joins_the_collective_with_every_load_failed(
    make_worker: MakeWorker,
) -> None:
    worker = make_worker(DictStore(1 << 20), _caches("blocks_first", random=True))
    fresh = StoreWorker(DictStore(1 << 20), namespace_id({"m": 1}), 0, TierStats())
    asked: list[list[bool]] = []
    for rank in (worker, fresh):
        rank.agree_with_ranks(lambda landed: asked.append(list(landed)) or list(landed))
    fresh.load([BlockTransfer(K1, 1)])  # no KV cache registered: it cannot load
    assert asked == [[False]] and fresh.take_load_errors() == {1}
