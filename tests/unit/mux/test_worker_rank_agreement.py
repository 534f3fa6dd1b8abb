"""MuxWorker under tensor parallelism: a child that agrees its loads with the other ranks
(a collective) is called on every rank, whatever happened on this rank alone."""

from __future__ import annotations

from typing import Any

import pytest

from kvmux.mux.capabilities import Capabilities
from kvmux.mux.plan import MuxStepPlan
from kvmux.mux.roster import Roster
from kvmux.mux.worker import MuxWorker
from kvmux.policies.breaker import CircuitBreaker


class AgreeingChild:
    """Counts the collectives it would enter: a load, or a join with every load failed."""

    def mux_capabilities(self) -> Capabilities:
        return Capabilities(layer_loads=False, agrees_across_ranks=True)

    def __init__(self, bind_fails: bool = False) -> None:
        self.collectives: list[str] = []
        self.bind_fails = bind_fails

    def bind_connector_metadata(self, meta: Any) -> None:
        if self.bind_fails:
            raise RuntimeError("a rank-local failure")

    def clear_connector_metadata(self) -> None:
        return None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.collectives.append("load")

    def mux_join_agreement(self, meta: Any) -> None:
        self.collectives.append("join")

    def wait_for_save(self) -> None:
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()


def _roster(children: list[AgreeingChild]) -> Roster:
    return Roster(((f"tier{i}", c, "tier", False) for i, c in enumerate(children)), CircuitBreaker)


def _step(children: list[AgreeingChild], open_breaker: set[int]) -> MuxWorker:
    worker = MuxWorker(_roster(children))
    for i in open_breaker:
        worker.guards[i].fail("wait_for_save", RuntimeError("this rank only"))
    plan = MuxStepPlan()
    for i in range(len(children)):
        plan.load_blocks[i] = [1, 2]
    worker.begin_step(plan, [{"loads": [1, 2]} for _ in children])
    worker.start_loads(None, {})
    return worker


@pytest.mark.parametrize("how", ["breaker", "bind"])
def test_a_child_left_out_on_one_rank_still_joins_the_collective(how: str) -> None:
    healthy = [AgreeingChild(), AgreeingChild()]
    _step(healthy, set())
    failing = [AgreeingChild(bind_fails=how == "bind"), AgreeingChild()]
    _step(failing, {0} if how == "breaker" else set())
    assert [c.collectives for c in healthy] == [["load"], ["load"]]
    assert [c.collectives for c in failing] == [["join"], ["load"]]  # same count, same order


def test_a_child_cut_off_by_the_scheduler_enters_no_collective_on_any_rank() -> None:
    child = AgreeingChild()
    worker = MuxWorker(_roster([child]))
    plan = MuxStepPlan()
    plan.load_blocks[0] = [1, 2]
    plan.fail_child(0)
    worker.begin_step(plan, [{"loads": [1, 2]}])
    worker.start_loads(None, {})
    assert child.collectives == []
