"""kvmux.mux.sole: over one child, the specialised scheduler answers as the general one.

Both schedulers get the same random sequences of hooks (lookups that hit, miss, look on,
raise; allocations with fewer tokens; breakers opening and recovering; steps taken;
finishes with async saves and params), each over its own copy of the same scripted child
and clock, and must return the same answers, tell the child the same things, and hand the
workers the same step plans.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from kvmux.mux.capabilities import Capabilities
from kvmux.mux.guard import ChildGuard, Notices
from kvmux.mux.plan import MuxStepPlan
from kvmux.mux.scheduler import MuxScheduler
from kvmux.mux.sole import SoleChildScheduler, scheduler_class
from kvmux.policies.breaker import CircuitBreaker
from kvmux.policies.selection import SCORE_CAPS

BLOCK = 16


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Child:
    """A child whose answers the test sets before each hook; it records what it is told."""

    def __init__(self, names_blocks: bool) -> None:
        self.offer: tuple[int | None, bool] = (0, False)
        self.raises: set[str] = set()
        self.finish: tuple[bool, dict[str, Any] | None] = (False, None)
        self.told: list[tuple[str, Any]] = []
        self.names_blocks = names_blocks

    def mux_capabilities(self) -> Capabilities:
        return Capabilities(names_load_blocks=self.names_blocks)

    def _hook(self, name: str) -> None:
        if name in self.raises:
            raise RuntimeError(name)

    def get_num_new_matched_tokens(self, request: Any, start: int) -> tuple[int | None, bool]:
        self.told.append(("lookup", (request.request_id, start)))
        self._hook("lookup")
        return self.offer

    def update_state_after_alloc(self, request: Any, blocks: Any, tokens: int) -> None:
        self.told.append(("alloc", (request.request_id, tokens)))
        self._hook("alloc")


def _plan_state(step: MuxStepPlan) -> tuple[Any, ...]:
    return tuple(repr(getattr(step, name)) for name in MuxStepPlan.__slots__)


def _twins(policy: str, names_blocks: bool, async_only: bool) -> list[Any]:
    """(scheduler, child, clock) for the general and the specialised scheduler."""
    twins = []
    for cls in (MuxScheduler, SoleChildScheduler):
        clock = Clock()
        child = Child(names_blocks)
        guard = ChildGuard("0:child", CircuitBreaker(1.0, 8.0, clock=clock), Notices())
        twins.append((cls([child], [guard], policy, [True], BLOCK, async_only), child, clock))
    return twins


def _blocks(count: int) -> Any:
    ids = list(range(100, 100 + count))
    return SimpleNamespace(get_block_ids=lambda: (ids,))


def _random_op(rng: random.Random) -> tuple[str, Any]:
    kind = rng.choice(["lookup", "lookup", "alloc", "step", "finish", "fail", "tick"])
    req = f"r{rng.randrange(4)}"
    if kind == "lookup":
        offer = rng.choice([None, 0, BLOCK, 3 * BLOCK, 5 * BLOCK + 3])
        return kind, (req, rng.choice([0, BLOCK]), offer, rng.random() < 0.5, rng.random() < 0.1)
    if kind == "alloc":
        return kind, (req, rng.choice([0, BLOCK, 2 * BLOCK, 8 * BLOCK]), rng.random() < 0.1)
    if kind == "finish":
        params = rng.choice([None, {}, {"k": 1}])
        return kind, (req, rng.random() < 0.5, params)
    if kind == "fail":
        return kind, rng.choice(["open", "meta"])
    return kind, rng.choice([0.5, 2.0])


def _apply(twin: Any, op: tuple[str, Any]) -> Any:
    sched, child, clock = twin
    kind, args = op
    if kind == "lookup":
        req, start, offer, is_async, raises = args
        child.offer = (offer, is_async)
        child.raises = {"lookup"} if raises else set()
        return sched.lookup(SimpleNamespace(request_id=req), start)
    if kind == "alloc":
        req, tokens, raises = args
        child.raises = {"alloc"} if raises else set()
        sched.after_alloc(SimpleNamespace(request_id=req), _blocks(16), tokens)
        return None
    if kind == "step":
        return _plan_state(sched.take_step([object()]))
    if kind == "finish":
        req, is_async, params = args
        return sched.finished(req, [(is_async, params)])
    if kind == "fail" and args == "open":
        sched.guards[0].force_open(1.0)
        return None
    if kind == "fail":  # the child's metadata failed this step
        return _plan_state(sched.take_step([None]))
    clock.now += args
    return None


@pytest.mark.parametrize("policy", [*SCORE_CAPS, "compose"])
@pytest.mark.parametrize("names_blocks", [False, True])
@pytest.mark.parametrize("async_only", [False, True])
def test_sole_child_scheduler_answers_as_the_general_one(
    policy: str, names_blocks: bool, async_only: bool
) -> None:
    for seed in range(60):
        rng = random.Random(seed)
        general, sole = _twins(policy, names_blocks, async_only)
        for n in range(80):
            op = _random_op(rng)
            assert _apply(general, op) == _apply(sole, op), (seed, n, op)
            assert general[1].told == sole[1].told, (seed, n, op)
            assert general[0].plans == sole[0].plans, (seed, n, op)
        g, s = general[0].guards[0], sole[0].guards[0]
        assert g.totals() == s.totals(), seed


def test_only_a_mux_of_one_child_gets_the_specialised_scheduler() -> None:
    assert scheduler_class(1) is SoleChildScheduler
    assert scheduler_class(2) is MuxScheduler
    assert scheduler_class(4) is MuxScheduler
