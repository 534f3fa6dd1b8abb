"""Asynchronous loads (kvmux.tier.worker.loader through StoreWorker): off the caller's thread,
each request reported exactly once, failures by position, aborts stop a load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

from kvmux.keys import BlockKey, block_keys, namespace_id, store_key  # noqa: E402
from kvmux.metrics import TierStats  # noqa: E402
from kvmux.stores import DictStore, KVStore  # noqa: E402
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, TierStepPlan  # noqa: E402
from kvmux.tier.worker import loader  # noqa: E402
from kvmux.tier.worker.loader import FinishedLoads, StepBudget  # noqa: E402
from kvmux.tier.worker.store_worker import StoreWorker  # noqa: E402

NUM_BLOCKS = 12
NS = namespace_id({"m": "async"})
KEYS = block_keys(NS, list(range(8 * 16)), 16)
SHAPE = (NUM_BLOCKS, 2, 4, 8)

MakeWorker = Callable[..., StoreWorker]


def _caches(random: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {
        f"layer.{i}": torch.randn(SHAPE, generator=generator) if random else torch.zeros(SHAPE)
        for i in range(2)
    }


class GatedStore(DictStore):
    """A memory store whose reads wait until the gate opens; counts them."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.gate = threading.Event()
        self.reads = 0

    def get(self, key: bytes) -> bytes | None:
        assert self.gate.wait(10), "the gate never opened"
        self.reads += 1
        return super().get(key)


@pytest.fixture
def make_worker() -> Iterator[MakeWorker]:
    workers: list[StoreWorker] = []

    def make(
        store: KVStore, caches: dict[str, torch.Tensor] | None, stats: TierStats
    ) -> StoreWorker:
        worker = StoreWorker(store, NS, 0, stats)
        if caches is not None:
            worker.register(caches, NUM_BLOCKS)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def _stored(store: KVStore, make_worker: MakeWorker, count: int) -> dict[str, torch.Tensor]:
    """Save blocks 0..count-1 of random caches under KEYS[0..count-1]; returns the caches."""
    source = _caches(random=True)
    saver = make_worker(store, source, TierStats())
    saver.save(TierStepPlan(saves=[BlockTransfer(KEYS[i], i) for i in range(count)]))
    saver.flush()
    return source


def _load(req_id: str, start: int, keys: list[BlockKey], blocks: list[int]) -> RequestLoad:
    positions = tuple((BlockTransfer(k, b),) for k, b in zip(keys, blocks, strict=True))
    return RequestLoad(req_id, start, positions)


def _wait(worker: StoreWorker, count: int = 1, aborted: set[str] | None = None) -> FinishedLoads:
    """Every report until ``count`` requests finished (a test never waits for ever)."""
    total = FinishedLoads()
    deadline = time.monotonic() + 10
    while len(total.finished) < count:
        assert time.monotonic() < deadline, "the load never finished"
        report = worker.finished_loads(aborted or set())
        assert not (report.finished & total.finished), "a request reported twice"
        total.finished |= report.finished
        total.failed.update(report.failed)
        total.failed_blocks |= report.failed_blocks
        time.sleep(0.001)
    return total


def test_an_async_load_runs_off_the_callers_thread_and_is_reported_once(
    make_worker: MakeWorker,
) -> None:
    store = GatedStore(1 << 20)
    store.gate.set()
    source = _stored(store, make_worker, 3)
    store.gate.clear()
    stats = TierStats()
    target = _caches(random=False)
    worker = make_worker(store, target, stats)
    worker.start_loads([_load("r", 0, KEYS[:3], [7, 8, 9])])
    assert worker.finished_loads() == FinishedLoads()  # still reading: nothing to report
    store.gate.set()
    report = _wait(worker)
    assert report == FinishedLoads(finished={"r"})
    for name in source:
        for src, dst in ((0, 7), (1, 8), (2, 9)):
            assert torch.equal(target[name][dst], source[name][src])
    assert (stats.loaded_blocks, stats.load_errors) == (3, 0)
    assert stats.load_seconds > 0
    assert worker.finished_loads() == FinishedLoads()  # never twice
    assert worker.take_load_errors() == set()  # an async load never reports block ids itself


def test_a_failed_block_fails_its_load_from_its_position(make_worker: MakeWorker) -> None:
    """Blocks at positions 2 and 4 load, the one at position 3 is missing: the load is
    reported failed at position 3 with that block; the others are copied in anyway."""
    store = DictStore(1 << 20)
    source = _stored(store, make_worker, 3)
    store.delete(store_key(KEYS[1], 0))
    stats = TierStats()
    target = _caches(random=False)
    worker = make_worker(store, target, stats)
    worker.start_loads([_load("r", 2, KEYS[:3], [7, 8, 9])])
    report = _wait(worker)
    assert report == FinishedLoads(finished={"r"}, failed={"r": 3}, failed_blocks={8})
    assert torch.equal(target["layer.0"][9], source["layer.0"][2])
    assert (stats.loaded_blocks, stats.load_errors) == (2, 1)
    assert worker.take_missing() == {KEYS[1]}  # the scheduler's index forgets it


def test_several_requests_load_at_once_each_reported_once(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    _stored(store, make_worker, 4)
    worker = make_worker(store, _caches(random=False), TierStats())
    loads = [_load(f"r{i}", 0, KEYS[i : i + 1], [6 + i]) for i in range(4)]
    worker.start_loads(loads[:2])
    worker.start_loads(loads[2:])
    assert _wait(worker, 4).finished == {"r0", "r1", "r2", "r3"}


def test_an_aborted_request_stops_loading_and_reports_no_failure(make_worker: MakeWorker) -> None:
    """Into host memory a load goes block by block: an abort is seen between blocks."""
    store = GatedStore(1 << 20)
    store.gate.set()
    _stored(store, make_worker, 4)
    store.gate.clear()
    store.reads = 0
    stats = TierStats()
    worker = make_worker(store, _caches(random=False), stats)
    keys = [KEYS[0], KEYS[1], KEYS[2], KEYS[5]]  # the last one is missing: it would fail
    worker.start_loads([_load("r", 0, keys, [6, 7, 8, 9])])
    assert worker.finished_loads({"r"}) == FinishedLoads()  # the engine finished it
    store.gate.set()
    assert _wait(worker) == FinishedLoads(finished={"r"})  # finished, no failure reported
    assert store.reads <= 1  # stopped at the next block
    assert stats.load_errors == 0


def test_a_bug_during_a_load_still_ends_it_reported_failed(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    _stored(store, make_worker, 2)
    worker = make_worker(store, _caches(random=False), TierStats())
    worker.start_loads([_load("r", 5, KEYS[:2], [6, NUM_BLOCKS + 3])])  # no such block
    report = _wait(worker)
    assert report.finished == {"r"}
    assert report.failed == {"r": 6}  # from the batch that raised (host memory: one block)
    assert report.failed_blocks == {NUM_BLOCKS + 3}


def test_a_worker_without_a_kv_cache_fails_its_loads(make_worker: MakeWorker) -> None:
    worker = make_worker(DictStore(1 << 20), None, TierStats())
    worker.start_loads([_load("r", 1, KEYS[:2], [3, 4])])
    assert _wait(worker) == FinishedLoads(finished={"r"}, failed={"r": 1}, failed_blocks={3, 4})


def test_an_async_load_waits_for_a_queued_save_of_its_key(make_worker: MakeWorker) -> None:
    store = DictStore(1 << 20)
    caches = _caches(random=True)
    expected = caches["layer.1"][3].clone()
    worker = make_worker(store, caches, TierStats())
    worker.save(TierStepPlan(saves=[BlockTransfer(KEYS[3], 3)]))  # not flushed
    worker.start_loads([_load("r", 0, [KEYS[3]], [10])])
    assert _wait(worker) == FinishedLoads(finished={"r"})
    assert torch.equal(caches["layer.1"][10], expected)


def test_close_stops_loads_in_flight(make_worker: MakeWorker) -> None:
    store = GatedStore(1 << 20)
    worker = StoreWorker(store, NS, 0, TierStats())
    worker.register(_caches(random=False), NUM_BLOCKS)
    worker.start_loads([_load("r", 0, KEYS[:1], [1])])
    store.gate.set()
    worker.close()  # returns: the load ended or never started


def test_a_step_budget_spreads_host_memory_loads_over_the_steps() -> None:
    budget = StepBudget(per_step=100)
    never = threading.Event()
    budget.take(60, never)
    budget.take(60, never)  # some left: taken, overdrawn
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (budget.take(10, never), taken.set()))
    waiter.start()
    assert not taken.wait(0.2)  # nothing left this step
    budget.refill()  # the next step repays the excess (20) and leaves 80
    assert taken.wait(5)
    waiter.join()
    budget.refill()
    budget.refill()  # unused shares never pile up past one step
    budget.take(100, never)
    cancel = threading.Event()
    cancel.set()
    budget.take(10, cancel)  # a cancelled load never waits
    StepBudget().take(10**12, never)  # without a limit: never waits


def test_a_load_into_host_memory_waits_for_the_engine_steps(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = 2 * 4 * 8 * 4  # bytes of one block of one layer
    monkeypatch.setattr(loader, "HOST_STEP_BYTES", 2 * block)  # one block (two layers) a step
    store = DictStore(1 << 20)
    _stored(store, make_worker, 3)
    stats = TierStats()
    worker = make_worker(store, _caches(random=False), stats)
    worker.start_loads([_load("r", 0, KEYS[:3], [7, 8, 9])])
    deadline = time.monotonic() + 5
    while stats.loaded_blocks < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert stats.loaded_blocks == 1  # the budget of the step it started in
    assert _wait(worker) == FinishedLoads(finished={"r"})  # each report is a step: on it goes


def test_an_idle_step_lets_a_paced_load_run_unpaced() -> None:
    budget = StepBudget(per_step=1)
    cancel = threading.Event()
    budget.take(1, cancel)  # the step's share is spent: the next take waits for a refill
    taker = threading.Thread(target=budget.take, args=(1, cancel), daemon=True)
    taker.start()
    budget.unpace(True)  # a step without a forward pass: no pacing
    taker.join(timeout=30)
    assert not taker.is_alive()
    budget.unpace(False)
