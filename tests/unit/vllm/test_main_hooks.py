"""Hooks of vLLM main's KVConnectorBase_V1 that MuxConnector forwards, as MultiConnector.

Two of them (``can_load_prefix_replay_checkpoint``, ``consume_prefix_replay_checkpoint``)
and the ``prefix_replay_checkpoints`` field of ``get_transfer_results``'s answer are not in
the installed vLLM: the scripted children define the hooks, and set the field as a plain
attribute. Each hook reaches the children that have it, aggregates as MultiConnector does
on main, and a child raising in it is counted, never propagated.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.vllm.scripted import ScriptedConnector, args_of
from tests.unit.vllm.test_mux_connector import (
    BLOCK_IDS,
    SCHEDULER,
    Engine,
    child,
    clock,  # noqa: F401  (autouse: fresh scripts)
    compose_engine,
    guard,
    make,
    request,
    script,
)

CAN_LOAD = "can_load_prefix_replay_checkpoint"
CONSUME = "consume_prefix_replay_checkpoint"
TAILS = [(0, 104, 72)]  # (group, block id, boundary) of a finished partial tail


def errors(mux: Any, i: int) -> float:
    """The errors the mux counted for child ``i``."""
    return float(guard(mux, i).counters["errors"])


def checkpoints(results: Any) -> dict[str, Any]:
    """The prefix replay checkpoints of transfer results (an attribute before vLLM main)."""
    return dict(getattr(results, "prefix_replay_checkpoints", None) or {})


# -- properties ---------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "expected"), [(False, False, False), (False, True, True)])
def test_requires_kv_delivery_when_any_child_does(a: bool, b: bool, expected: bool) -> None:
    mux = make(SCHEDULER, child("a", kv_delivery=a), child("b", kv_delivery=b))
    assert mux.requires_kv_delivery is expected
    assert len(args_of("a", "requires_kv_delivery")) == len(args_of("b", "requires_kv_delivery"))


def test_requires_kv_delivery_of_a_raising_child_is_true_and_counted() -> None:
    mux = make(
        SCHEDULER,
        child("a", kv_delivery=False, raise_in=["requires_kv_delivery"]),
        child("b", kv_delivery=False),
    )
    assert mux.requires_kv_delivery is True  # the safe answer: recompute, never lose KV
    assert errors(mux, 0) == 1
    assert args_of("b", "requires_kv_delivery") == [()]


@pytest.mark.parametrize(("a", "b", "expected"), [(True, True, True), (True, False, False)])
def test_divergent_hybrid_hits_only_when_every_child_has_them(
    a: bool, b: bool, expected: bool
) -> None:
    mux = make(SCHEDULER, child("a", divergent=a), child("b", divergent=b))
    assert mux.supports_divergent_local_hybrid_hits is expected
    assert args_of("b", "supports_divergent_local_hybrid_hits") == [()]


def test_divergent_hybrid_hits_of_a_raising_child_are_false_and_counted() -> None:
    mux = make(
        SCHEDULER,
        child("a", divergent=True, raise_in=["supports_divergent_local_hybrid_hits"]),
        child("b", divergent=True),
    )
    assert mux.supports_divergent_local_hybrid_hits is False
    assert errors(mux, 0) == 1


# -- partial tails and PP-aware handshakes --------------------------------------------------


def test_partial_tail_reaches_every_child_and_any_may_take_it() -> None:
    mux = make(SCHEDULER, child("a"), child("b", partial_tail=True))
    assert mux.register_finished_partial_tail(request(), (BLOCK_IDS,), TAILS) is True
    assert args_of("a", "register_finished_partial_tail") == [("r1", TAILS)]
    assert args_of("b", "register_finished_partial_tail") == [("r1", TAILS)]
    assert mux.register_finished_partial_tail(request("r2"), (BLOCK_IDS,), TAILS) is True
    script("b")["partial_tail"] = False
    assert mux.register_finished_partial_tail(request("r3"), (BLOCK_IDS,), TAILS) is False


def test_a_child_taking_the_partial_tail_owes_the_finished_sending() -> None:
    """vLLM keeps the blocks until the request's finished sending: the mux waits for the
    child that took the tail, though its request_finished saves nothing asynchronously."""
    engine = Engine(child("a"), child("b", partial_tail=True))
    engine.sched.register_finished_partial_tail(request(), (BLOCK_IDS,), TAILS)
    assert engine.sched.request_finished(request(), BLOCK_IDS) == (True, None)
    script("a")["finished_sending"] = ["r1"]  # a owes nothing: ignored
    step = engine.step(finished={"r1"})
    assert step.meta.plan.async_savers == {"r1": {1}}
    assert step.results.finished_sending == set()
    script("b")["finished_sending"] = ["r1"]
    assert engine.step().results.finished_sending == {"r1"}
    assert engine.sched.sched._tail_keepers == {}


def test_a_child_raising_in_partial_tail_is_counted_and_takes_nothing() -> None:
    mux = make(
        SCHEDULER, child("a", partial_tail=True, raise_in=["register_finished_partial_tail"])
    )
    assert mux.register_finished_partial_tail(request(), (BLOCK_IDS,), TAILS) is False
    assert errors(mux, 0) == 1
    assert mux.request_finished(request(), BLOCK_IDS) == (False, None)


def test_pp_aware_handshake_reaches_every_child_past_one_that_raises() -> None:
    mux = make(
        SCHEDULER,
        child("a", raise_in=["set_xfer_handshake_metadata_pp_aware"]),
        child("b"),
    )
    metadata: dict[tuple[int, int], Any] = {(0, 0): "m00", (1, 0): "m10"}
    mux.set_xfer_handshake_metadata_pp_aware(metadata)
    assert args_of("a", "set_xfer_handshake_metadata_pp_aware") == [(metadata,)]
    assert args_of("b", "set_xfer_handshake_metadata_pp_aware") == [(metadata,)]
    assert errors(mux, 0) == 1


# -- prefix replay checkpoints: scheduler side ----------------------------------------------


def test_checkpoint_questions_go_to_the_loader_only() -> None:
    mux = make(SCHEDULER, child("a"), child("b", offer=32, replay_checkpoint=True))
    assert mux.get_num_new_matched_tokens(request(), 16) == (32, False)
    assert mux.can_load_prefix_replay_checkpoint(request(), 16, 31) is True
    assert mux.consume_prefix_replay_checkpoint(request(), 47) is True
    assert args_of("b", CAN_LOAD) == [("r1", 16, 31)]
    assert args_of("b", CONSUME) == [("r1", 47)]
    assert args_of("a", CAN_LOAD) == args_of("a", CONSUME) == []


def test_checkpoint_questions_without_a_loader_are_false_and_ask_nobody() -> None:
    mux = make(SCHEDULER, child("a", replay_checkpoint=True))
    assert mux.can_load_prefix_replay_checkpoint(request(), 16, 32) is False
    assert mux.get_num_new_matched_tokens(request(), 16) == (0, False)
    assert mux.consume_prefix_replay_checkpoint(request(), 48) is False
    assert args_of("a", CAN_LOAD) == args_of("a", CONSUME) == []


def test_compose_asks_the_child_whose_load_covers_the_boundary_from_its_own_start() -> None:
    """a loads [16, 48), b loads [48, 64): a hit ending in b's range is b's checkpoint."""
    engine = compose_engine(a={"replay_checkpoint": False}, b={"replay_checkpoint": True})
    engine.schedule(request(), computed=16)
    sched = engine.sched
    assert sched.can_load_prefix_replay_checkpoint(request(), 16, 47) is True
    assert args_of("b", CAN_LOAD) == [("r1", 48, 15)]
    assert sched.can_load_prefix_replay_checkpoint(request(), 16, 20) is False
    assert args_of("a", CAN_LOAD) == [("r1", 16, 20)]
    assert sched.consume_prefix_replay_checkpoint(request(), 64) is True
    assert sched.consume_prefix_replay_checkpoint(request(), 48) is False  # a's range end
    assert args_of("b", CONSUME) == [("r1", 64)]
    assert args_of("a", CONSUME) == [("r1", 48)]
    assert sched.consume_prefix_replay_checkpoint(request(), 65) is False  # past the plan


@pytest.mark.parametrize("hook", [CAN_LOAD, CONSUME])
def test_a_child_raising_in_a_checkpoint_question_is_counted_and_answers_false(hook: str) -> None:
    mux = make(SCHEDULER, child("a", offer=32, replay_checkpoint=True, raise_in=[hook]))
    mux.get_num_new_matched_tokens(request(), 16)
    ask = getattr(mux, hook)
    assert (ask(request(), 16, 32) if hook == CAN_LOAD else ask(request(), 48)) is False
    assert errors(mux, 0) == 1


def test_a_cut_off_loader_cannot_load_a_checkpoint() -> None:
    mux = make(SCHEDULER, child("a", offer=32, replay_checkpoint=True, raise_in=[CAN_LOAD]))
    mux.get_num_new_matched_tokens(request(), 16)
    assert mux.can_load_prefix_replay_checkpoint(request(), 16, 32) is False
    script("a")["raise_in"] = []
    assert mux.can_load_prefix_replay_checkpoint(request(), 16, 32) is False  # breaker open
    assert len(args_of("a", CAN_LOAD)) == 1
    assert mux.consume_prefix_replay_checkpoint(request(), 48) is True  # completion: asked


@pytest.mark.parametrize("hook", [CAN_LOAD, CONSUME])
def test_a_child_without_the_hook_answers_false_uncounted(
    hook: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a vLLM whose base class lacks it (main's base answers False)."""
    monkeypatch.delattr(ScriptedConnector, hook)
    mux = make(SCHEDULER, child("a", offer=32, replay_checkpoint=True))
    mux.get_num_new_matched_tokens(request(), 16)
    ask = getattr(mux, hook)
    assert (ask(request(), 16, 32) if hook == CAN_LOAD else ask(request(), 48)) is False
    assert errors(mux, 0) == 0


# -- prefix replay checkpoints: worker side ---------------------------------------------------

CP = ("transfer-1", 48, "digest")
OTHER = ("transfer-2", 48, "digest")


def test_a_loaders_checkpoint_goes_out_with_the_receive() -> None:
    engine = Engine(child("a", offer=32, **{"async": True}), child("b"))
    engine.schedule(request(), computed=16)
    script("a")["finished_recving"] = ["r1"]
    script("a")["checkpoints"] = {"r1": CP}
    results = engine.step().results
    assert results.finished_recving == {"r1"}
    assert checkpoints(results) == {"r1": CP}
    assert checkpoints(engine.step().results) == {}  # once


def test_a_checkpoint_waits_for_the_receive_of_every_loader() -> None:
    engine = compose_engine(a={"async": True}, b={"async": True})
    engine.schedule(request(), computed=16)
    script("b")["finished_recving"] = ["r1"]
    script("b")["checkpoints"] = {"r1": CP}
    assert checkpoints(engine.step().results) == {}  # a still loading
    script("a")["finished_recving"] = ["r1"]
    results = engine.step().results
    assert results.finished_recving == {"r1"}
    assert checkpoints(results) == {"r1": CP}


@pytest.mark.parametrize(("b_checkpoint", "expected"), [(CP, {"r1": CP}), (OTHER, {})])
def test_checkpoints_of_several_children_are_kept_only_when_they_agree(
    b_checkpoint: tuple[str, int, str], expected: dict[str, Any]
) -> None:
    """MultiConnector drops a request's checkpoint that two children report differently."""
    engine = compose_engine(a={"async": True}, b={"async": True})
    engine.schedule(request(), computed=16)
    script("a")["finished_recving"] = script("b")["finished_recving"] = ["r1"]
    script("a")["checkpoints"] = {"r1": CP}
    script("b")["checkpoints"] = {"r1": b_checkpoint}
    assert checkpoints(engine.step().results) == expected


def test_a_failed_receive_sends_no_checkpoint() -> None:
    engine = compose_engine(a={"async": True, "raise_in": ["start_load_kv"]}, b={"async": True})
    engine.schedule(request(), computed=16)
    engine.step()
    script("b")["finished_recving"] = ["r1"]
    script("b")["checkpoints"] = {"r1": CP}
    results = engine.step().results
    assert results.failed_recving == {"r1"}
    assert checkpoints(results) == {}


def test_checkpoints_of_a_request_finished_without_a_receive_are_dropped() -> None:
    engine = Engine(child("a"))
    script("a")["checkpoints"] = {"stray": CP}
    assert checkpoints(engine.step().results) == {}
    assert engine.worker.work._checkpoints == {"stray": {0: CP}}
    assert checkpoints(engine.step(finished={"stray"}).results) == {}
    assert engine.worker.work._checkpoints == {}
