"""kvmux.mux.worker: a child whose results call raises keeps what it owes until that is safe.

Reporting a load finished lets vLLM use, free or reuse its blocks; a loader thread of the
child may still be writing them. So a failed results call holds the child's loads (and
saves) until the child reports them again or ``give_up_seconds`` pass, then each request
finishes once, its load failed (vLLM recomputes it and never reads those blocks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvmux.mux.capabilities import Capabilities
from kvmux.mux.plan import EMPTY_STEP, MuxStepPlan
from kvmux.mux.roster import Roster
from kvmux.mux.worker import MuxWorker, TransferResult
from kvmux.policies.breaker import CircuitBreaker

GIVE_UP = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Results:
    """What a child's ``get_transfer_results`` returns."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


class ThreadedChild:
    """Loads on a thread per request that writes its blocks once ``go`` is set, and reports
    each finished load once; its results call raises while ``broken``."""

    def mux_capabilities(self) -> Capabilities:
        return Capabilities(layer_loads=False)  # no per-layer work: loads run on threads

    def __init__(self, cache: dict[int, str]):
        self.cache = cache  # block id -> whose KV it holds
        self.broken = False
        self.go = threading.Event()
        self.threads: list[threading.Thread] = []
        self.sent: set[str] = set()  # saves to report at the next call
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self._meta: dict[str, list[int]] = {}

    def bind_connector_metadata(self, meta: dict[str, list[int]]) -> None:
        self._meta = meta

    def clear_connector_metadata(self) -> None:
        self._meta = {}

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        for req_id, blocks in self._meta.items():
            thread = threading.Thread(target=self._load, args=(req_id, blocks))
            self.threads.append(thread)
            thread.start()

    def _load(self, req_id: str, blocks: list[int]) -> None:
        self.go.wait(10.0)
        for block in blocks:
            self.cache[block] = req_id
        with self._lock:
            self._done.add(req_id)

    def wait_for_save(self) -> None:
        pass

    def get_transfer_results(self, finished_req_ids: set[str]) -> Results:
        if self.broken:
            raise RuntimeError("transfer results lost")
        with self._lock:
            done, self._done = self._done, set()
        sent, self.sent = self.sent, set()
        return Results(finished_sending=sent, finished_recving=done)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def writing(self) -> bool:
        """Whether a loader thread may still write into the KV cache."""
        return any(thread.is_alive() for thread in self.threads)

    def stop(self) -> None:
        self.go.set()
        for thread in self.threads:
            thread.join(10.0)


class Engine:
    """Drives a MuxWorker step by step, as vLLM's model runner does."""

    def __init__(self, children: list[ThreadedChild], clock: Clock):
        roster = Roster(
            ((f"{i}:child", c, "child", False) for i, c in enumerate(children)),
            lambda: CircuitBreaker(1.0, 8.0, clock=clock),
        )
        self.children = children
        self.worker = MuxWorker(roster, GIVE_UP, clock)
        self.finished: list[str] = []  # every finished receive, in order, repeats kept

    def step(
        self, plan: MuxStepPlan = EMPTY_STEP, metas: list[dict[str, list[int]]] | None = None
    ) -> tuple[TransferResult, set[int]]:
        """One step; never raises (the test fails if it does)."""
        worker = self.worker
        worker.begin_step(plan, metas or [{} for _ in self.children])
        worker.start_loads(None, {})
        worker.save()
        results: TransferResult = (set(), set(), set())
        worker.transfer_results(set(), results)
        errors = worker.load_errors()
        worker.end_step()
        self.finished += sorted(results[1])
        return results, errors


def load_plan(req_id: str, blocks: list[int], children: set[int]) -> MuxStepPlan:
    plan = MuxStepPlan()
    for i in children:
        plan.load_blocks[i] = list(blocks)
    plan.expect_loaders(req_id, set(children))
    return plan


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache() -> dict[int, str]:
    return {}


@pytest.fixture
def child(cache: dict[int, str]) -> Iterator[ThreadedChild]:
    made = ThreadedChild(cache)
    yield made
    made.stop()


def test_a_load_is_held_while_the_child_may_still_write(
    child: ThreadedChild, cache: dict[int, str], clock: Clock
) -> None:
    engine = Engine([child], clock)
    child.broken = True
    results, _ = engine.step(load_plan("r1", [3, 4], {0}), [{"r1": [3, 4]}])
    assert results[1] == set()  # not finished: the loader thread has not written yet
    for _ in range(3):
        clock.now += 1.0
        results, _ = engine.step()
        assert results[1] == set() and child.writing()
    assert engine.worker.guards[0].counters["errors"] == 4  # every call raised, each counted
    child.go.set()
    for thread in child.threads:
        thread.join(10.0)
    assert cache == {3: "r1", 4: "r1"}  # the late write that an early report let through
    child.broken = False  # the child reports the load itself: no thread of it writes now
    results, errors = engine.step()
    assert not child.writing()
    assert results[1] == {"r1"} and results[2] == {"r1"}  # its missed report: recomputed
    assert errors == set()
    assert engine.step()[0] == (set(), set(), set())
    assert engine.finished == ["r1"]


def test_a_child_that_stays_broken_releases_its_loads_after_the_bound_as_failed(
    child: ThreadedChild, clock: Clock
) -> None:
    engine = Engine([child], clock)
    child.broken = True
    engine.step(load_plan("r1", [3, 4], {0}), [{"r1": [3, 4]}])
    clock.now = GIVE_UP - 1.0
    assert engine.step()[0][1] == set()
    clock.now = GIVE_UP
    (_, recving, failed), errors = engine.step()
    # a failed receive: vLLM drops the request's computed tokens and frees its blocks
    # without caching them, so nothing the child wrote is ever read
    assert recving == {"r1"} and failed == {"r1"}
    # no block ids besides: redundant after a failed receive, refused by vLLM with
    # several KV cache groups, and the mux knows only whole steps' blocks
    assert errors == set()
    child.go.set()
    child.broken = False
    for thread in child.threads:
        thread.join(10.0)
    assert engine.step()[0] == (set(), set(), set())  # its late report is ignored
    assert engine.worker.recving.ignored == 1
    assert engine.finished == ["r1"]


def test_the_bound_runs_from_the_failure_even_if_the_child_answers_in_between(
    child: ThreadedChild, clock: Clock
) -> None:
    """A child whose failed call lost its report never reports the load again."""
    engine = Engine([child], clock)
    child.go.set()
    child.broken = True
    engine.step(load_plan("r1", [3], {0}), [{"r1": [3]}])
    child.threads[0].join(10.0)
    child.broken = False
    child.get_transfer_results(set())  # what the failed call lost
    clock.now = GIVE_UP / 2
    assert engine.step()[0][1] == set()
    child.broken = True
    clock.now = GIVE_UP - 0.5
    assert engine.step()[0][1] == set()  # a second failure does not restart the bound
    clock.now = GIVE_UP
    assert engine.step()[0][1:] == ({"r1"}, {"r1"})
    assert engine.finished == ["r1"]


def test_a_request_of_two_loaders_finishes_once(cache: dict[int, str], clock: Clock) -> None:
    broken, healthy = ThreadedChild(cache), ThreadedChild(cache)
    try:
        engine = Engine([broken, healthy], clock)
        broken.broken = True
        engine.step(load_plan("r1", [3, 4], {0, 1}), [{"r1": [3]}, {"r1": [4]}])
        healthy.go.set()
        healthy.threads[0].join(10.0)
        assert engine.step()[0][1] == set()  # the healthy loader reported; the other owes
        clock.now = GIVE_UP
        assert engine.step()[0][1:] == ({"r1"}, {"r1"})
        broken.broken = False
        broken.go.set()
        broken.threads[0].join(10.0)
        engine.step()
        assert engine.finished == ["r1"]
    finally:
        broken.stop()
        healthy.stop()


def test_loads_the_child_never_started_are_released_at_once(
    child: ThreadedChild, clock: Clock
) -> None:
    """A child cut off at the start of the step started no thread: nothing to wait for."""
    engine = Engine([child], clock)
    child.broken = True
    engine.step()  # the failure opens its breaker
    plan = load_plan("r2", [5], {0})
    (_, recving, failed), errors = engine.step(plan, [{"r2": [5]}])
    assert child.threads == []
    assert recving == {"r2"} and failed == {"r2"} and errors == {5}


def test_sends_are_held_then_given_up(child: ThreadedChild, clock: Clock) -> None:
    """A late read of freed blocks could save another request's KV, so sends wait too;
    a child broken past the bound no longer holds the blocks."""
    engine = Engine([child], clock)
    plan = MuxStepPlan()
    plan.expect_savers("s1", {0})
    child.broken = True
    assert engine.step(plan)[0][0] == set()
    child.broken = False  # answers, but its report of the save was lost
    clock.now = GIVE_UP / 2
    assert engine.step()[0][0] == set()
    child.broken = True
    clock.now = GIVE_UP - 1.0
    assert engine.step()[0][0] == set()
    clock.now = GIVE_UP
    assert engine.step()[0][0] == {"s1"}
    child.broken = False
    child.sent = {"s1"}
    assert engine.step()[0][0] == set()  # once


def test_a_send_completes_when_the_child_reports_it_again(
    child: ThreadedChild, clock: Clock
) -> None:
    engine = Engine([child], clock)
    plan = MuxStepPlan()
    plan.expect_savers("s1", {0})
    child.broken = True
    engine.step(plan)
    child.broken = False
    child.sent = {"s1"}
    assert engine.step()[0][0] == {"s1"}
    clock.now = GIVE_UP
    assert engine.step()[0][0] == set()
