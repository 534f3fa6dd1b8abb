"""kvmux.mux.plan: a step's plan, whose containers are made when something goes in."""

from __future__ import annotations

import pickle

from kvmux.mux.plan import EMPTY_STEP, MuxStepPlan


def _fields(plan: MuxStepPlan) -> tuple[object, ...]:
    return (
        plan.load_blocks,
        plan.failed_blocks,
        plan.async_loaders,
        plan.async_savers,
        plan.cut_off,
    )


def test_a_new_plan_is_empty_and_fills_through_its_methods() -> None:
    plan = MuxStepPlan()
    assert _fields(plan) == ({}, [], {}, {}, set())
    plan.load_blocks[0] = [1, 2]
    plan.add_failed([7])
    plan.expect_loaders("r", {0, 1})
    plan.expect_savers("s", {1})
    assert _fields(plan) == ({0: [1, 2]}, [7], {"r": {0, 1}}, {"s": {1}}, set())


def test_filling_one_plan_leaves_every_other_empty() -> None:
    plan = MuxStepPlan()
    plan.add_failed([7])
    plan.expect_loaders("r", {0})
    plan.expect_savers("s", {0})
    plan.fail_child(0)
    assert _fields(MuxStepPlan()) == ({}, [], {}, {}, set())
    assert _fields(EMPTY_STEP) == ({}, [], {}, {}, set())


def test_fail_child_turns_its_loads_into_errors() -> None:
    plan = MuxStepPlan()
    plan.load_blocks[0] = [1, 2]
    plan.load_blocks[1] = [3]
    plan.expect_loaders("r", {0, 1})
    plan.fail_child(0)
    assert plan.load_blocks == {1: [3]}
    assert plan.failed_blocks == [1, 2]
    assert plan.async_loaders == {"r": {1}}
    assert plan.cut_off == {0}


def test_a_plan_crosses_processes() -> None:
    plan = MuxStepPlan()
    plan.load_blocks[0] = [1]
    plan.expect_savers("s", {0})
    copy = pickle.loads(pickle.dumps(plan))
    assert _fields(copy) == _fields(plan)
    assert _fields(pickle.loads(pickle.dumps(EMPTY_STEP))) == ({}, [], {}, {}, set())
