"""The real MuxConnector over scripted children that vLLM's factory loads.

Children are ``tests.unit.vllm.scripted.ScriptedConnector`` instances (real
``KVConnectorBase_V1`` subclasses), configured through ``kv_connector_extra_config`` and
recording every call. Breakers run on a fake clock; nothing here depends on wall-clock time.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.v1.outputs import KVConnectorOutput

import kvmux.vllm.mux_connector as mux_module
import kvmux.vllm.mux_stats as mux_stats
from kvmux.errors import ConfigError
from kvmux.mux.scheduler import TransferParamsClash
from kvmux.mux.worker import MuxWorker
from kvmux.policies.breaker import CircuitBreaker
from kvmux.vllm import MuxConnector
from kvmux.vllm.metadata import MuxMetadata, MuxWorkerMetadata
from kvmux.vllm.stats import MuxConnectorStats
from tests.unit.vllm import scripted
from tests.unit.vllm.scripted import (
    SCRIPTS,
    ScriptedConnector,
    ScriptedMetadata,
    ScriptedStats,
    ScriptedWorkerMeta,
    args_of,
    calls,
)

SCHEDULER = KVConnectorRole.SCHEDULER
WORKER = KVConnectorRole.WORKER
BLOCK = 16
BREAKER = 2.0  # breaker_seconds of every mux here
A = "0:ScriptedConnector"  # labels: position and the child's kv_connector name
B = "1:ScriptedConnector"
FORWARD = SimpleNamespace(name="forward-context")
KV_LAYER = torch.zeros(2)
ATTN = SimpleNamespace(name="attn-metadata")


# -- fixtures and helpers -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    """Fresh scripts, and every breaker MuxConnector builds runs on a fake clock.

    (Patching ``kvmux.policies.breaker.time.monotonic`` would not do: CircuitBreaker binds
    ``time.monotonic`` as a default argument when the module is imported.)
    """
    scripted.reset()
    fake = Clock()
    monkeypatch.setattr(mux_module, "CircuitBreaker", functools.partial(CircuitBreaker, clock=fake))
    monkeypatch.setattr(mux_module, "MuxWorker", functools.partial(MuxWorker, clock=fake))
    yield fake
    scripted.reset()


def child(name: str, **script: Any) -> dict[str, Any]:
    """KVTransferConfig fields of a scripted child."""
    return {
        "kv_connector": "ScriptedConnector",
        "kv_connector_module_path": scripted.MODULE,
        "kv_connector_extra_config": {"name": name, **script},
    }


def vllm_config(*children: dict[str, Any], **extra: Any) -> SimpleNamespace:
    extra.setdefault("breaker_seconds", BREAKER)
    ktc = KVTransferConfig(
        kv_connector="MuxConnector",
        kv_connector_module_path="kvmux.vllm",
        kv_role="kv_both",
        engine_id="mux-engine",
        kv_buffer_device="cpu",
        kv_connector_extra_config={"connectors": list(children), **extra},
    )
    return SimpleNamespace(kv_transfer_config=ktc, cache_config=SimpleNamespace(block_size=BLOCK))


def make(role: KVConnectorRole, *children: dict[str, Any], **extra: Any) -> MuxConnector:
    return MuxConnector(vllm_config(*children, **extra), role, None)


class Blocks:
    """A KVCacheBlocks stand-in with one group."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self.ids),)


def request(req_id: str = "r1", tokens: int = 80) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=req_id, prompt_token_ids=list(range(tokens)), num_tokens=tokens
    )


BLOCK_IDS = [100, 101, 102, 103, 104]  # the request's five blocks of 16 tokens


def script(name: str) -> dict[str, Any]:
    return SCRIPTS[name]


def guard(mux: MuxConnector, i: int) -> Any:
    return mux._roster.guards[i]


@dataclass
class Step:
    meta: MuxMetadata
    results: KVConnectorTransferResults
    load_errors: set[int]


class Engine:
    """A scheduler-side and a worker-side MuxConnector over the same children."""

    def __init__(self, *children: dict[str, Any], **extra: Any):
        self.sched = make(SCHEDULER, *children, **extra)
        self.worker = make(WORKER, *children, **extra)
        self.output = SimpleNamespace(finished_req_ids=set())

    def schedule(
        self, req: Any, computed: int = 0, external: int | None = None, ids: list[int] | None = None
    ) -> tuple[int | None, bool]:
        offer = self.sched.get_num_new_matched_tokens(req, computed)
        tokens = offer[0] or 0 if external is None else external
        self.sched.update_state_after_alloc(req, Blocks(ids or BLOCK_IDS), tokens)
        return offer

    def meta(self) -> MuxMetadata:
        meta = self.sched.build_connector_meta(self.output)
        assert isinstance(meta, MuxMetadata)
        return meta

    def step(self, finished: set[str] | None = None, meta: MuxMetadata | None = None) -> Step:
        meta = meta or self.meta()
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(FORWARD)
        if w.has_connector_metadata():  # vLLM's gate of the per-layer hooks
            w.wait_for_layer_load("layer.0")
            w.save_kv_layer("layer.0", KV_LAYER, ATTN)
        w.wait_for_save()
        results = w.get_transfer_results(set(finished or ()))
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        return Step(meta, results, errors)


def compose_engine(a: dict[str, Any] | None = None, b: dict[str, Any] | None = None) -> Engine:
    """a loads [16, 48) = blocks 101, 102; b loads [48, 64) = block 103."""
    return Engine(
        child("a", **{"offer": {16: 32}, "offset_capable": True, **(a or {})}),
        child("b", **{"offer": {48: 16}, "offset_capable": True, **(b or {})}),
        policy="compose",
    )


# -- construction ---------------------------------------------------------------------


def test_children_are_built_by_vllms_factory() -> None:
    mux = make(SCHEDULER, child("a"), {**child("b"), "kv_role": "kv_consumer"})
    assert [g.label for g in mux._roster.guards] == [A, B]
    a, b = mux.children
    assert type(a) is ScriptedConnector and isinstance(a, KVConnectorBase_V1)
    assert a.role is SCHEDULER
    assert (a.name, b.name) == ("a", "b")
    for c in (a, b):
        ktc = c.kv_transfer_config
        assert ktc is not mux._kv_transfer_config
        assert ktc.kv_connector == "ScriptedConnector"
        assert ktc.engine_id == "mux-engine"
        assert ktc.kv_buffer_device == "cpu"
    assert a.kv_transfer_config.kv_role == "kv_both"
    assert b.kv_transfer_config.kv_role == "kv_consumer"
    assert mux.children is not mux.children  # a copy
    assert len(args_of("a", "__init__")) == 1


def test_load_failure_policy_becomes_recompute_unless_asked_to_fail() -> None:
    assert make(SCHEDULER, child("a"))._kv_transfer_config.kv_load_failure_policy == "recompute"
    strict = make(SCHEDULER, child("a"), fail_on_load_error=True)
    assert strict._kv_transfer_config.kv_load_failure_policy == "fail"


def test_unloadable_child_is_a_config_error() -> None:
    missing = {**child("a"), "kv_connector": "NoSuchConnector"}
    with pytest.raises(ConfigError) as info:
        make(SCHEDULER, missing)
    assert info.value.key == "connectors[0:NoSuchConnector]"


def test_bad_mux_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        make(SCHEDULER, child("a"), policy="fastest")
    assert info.value.key == "policy"


def test_properties_aggregate_over_children() -> None:
    mux = make(SCHEDULER, child("a"), child("b"))
    assert mux.requires_kv_delivery  # kv_both children are producers
    assert mux.supports_divergent_local_hybrid_hits is False
    assert mux.get_mem_pool_context() is None
    assert mux.get_handshake_metadata() is None


def test_the_first_childs_memory_pool_wins_and_a_pool_that_fails_stops_the_start() -> None:
    mux = make(WORKER, child("a"), child("b"))
    a, b = mux.children
    asked: list[str] = []
    a.get_mem_pool_context = lambda: asked.append("a")  # type: ignore[method-assign]
    b.get_mem_pool_context = lambda: asked.append("b") or "pool-b"  # type: ignore[method-assign]
    assert mux.get_mem_pool_context() == "pool-b"
    assert asked == ["a", "b"]

    def no_pool() -> None:
        raise RuntimeError("custom MemPool could not be created")

    a.get_mem_pool_context = no_pool  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="MemPool"):  # never a silent other pool
        mux.get_mem_pool_context()


# -- lookups ----------------------------------------------------------------------------


def test_first_takes_the_first_child_with_tokens() -> None:
    mux = make(SCHEDULER, child("a", offer=0), child("b", offer=32), child("c", offer=64))
    assert mux.get_num_new_matched_tokens(request(), 16) == (32, False)
    for name in ("a", "b", "c"):
        assert args_of(name, "get_num_new_matched_tokens") == [("r1", 16)]


def test_longest_takes_the_most_tokens() -> None:
    mux = make(
        SCHEDULER,
        child("a", offer=16),
        child("b", offer=48, **{"async": True}),
        child("c", offer=48),
        policy="longest",
    )
    assert mux.get_num_new_matched_tokens(request(), 0) == (48, True)
    assert [c.child for c in mux.sched.contributions("r1")] == [1]


def test_compose_asks_each_child_from_where_the_previous_stopped() -> None:
    engine = compose_engine(b={"async": True})
    assert engine.sched.get_num_new_matched_tokens(request(), 16) == (48, True)
    assert args_of("a", "get_num_new_matched_tokens") == [("r1", 16)]
    assert args_of("b", "get_num_new_matched_tokens") == [("r1", 48)]


def test_compose_skips_a_child_that_cannot_load_at_an_offset() -> None:
    mux = make(
        SCHEDULER,
        child("a", offer=32, offset_capable=True),
        child("b", offer=16, offset_capable=False),
        policy="compose",
    )
    assert mux.get_num_new_matched_tokens(request(), 0) == (32, False)
    assert args_of("b", "get_num_new_matched_tokens") == []


@pytest.mark.parametrize("policy", ["first", "longest", "compose"])
def test_none_while_any_child_looks(policy: str) -> None:
    mux = make(
        SCHEDULER,
        child("a", offer=0, offset_capable=True),
        child("b", offer=None, offset_capable=True),
        policy=policy,
    )
    assert mux.get_num_new_matched_tokens(request(), 0) == (None, False)
    script("b")["offer"] = 32
    assert mux.get_num_new_matched_tokens(request(), 0) == (32, False)
    assert len(args_of("b", "get_num_new_matched_tokens")) == 2


def test_no_offers() -> None:
    mux = make(SCHEDULER, child("a"), child("b"))
    assert mux.get_num_new_matched_tokens(request(), 0) == (0, False)
    assert guard(mux, 0).lookups == 1
    assert guard(mux, 1).lookups == 1


# -- update_state_after_alloc -----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "offers", "loader"),
    [("first", (0, 32, 48), 1), ("longest", (16, 32, 48), 2)],
)
def test_loader_gets_its_tokens_and_others_zero(
    policy: str, offers: tuple[int, ...], loader: int
) -> None:
    names = ("a", "b", "c")
    children = [child(n, offer=o) for n, o in zip(names, offers, strict=True)]
    mux = make(SCHEDULER, *children, policy=policy)
    tokens, _ = mux.get_num_new_matched_tokens(request(), 16)
    assert tokens == offers[loader]
    mux.update_state_after_alloc(request(), Blocks(BLOCK_IDS), tokens)
    for i, name in enumerate(names):
        expected = offers[loader] if i == loader else 0
        assert args_of(name, "update_state_after_alloc") == [("r1", BLOCK_IDS, expected)]
    assert guard(mux, loader).hit_tokens == offers[loader]


def test_compose_contributors_get_their_share_at_their_start() -> None:
    engine = compose_engine()
    engine.schedule(request(), computed=16)
    assert args_of("a", "get_num_new_matched_tokens") == [("r1", 16)]
    assert args_of("b", "get_num_new_matched_tokens") == [("r1", 48)]
    assert args_of("a", "update_state_after_alloc") == [("r1", BLOCK_IDS, 32)]
    assert args_of("b", "update_state_after_alloc") == [("r1", BLOCK_IDS, 16)]
    plan = engine.meta().plan
    assert plan.load_blocks == {0: [101, 102], 1: [103]}
    assert plan.failed_blocks == []


def test_compose_fewer_external_tokens_trims_the_last_share() -> None:
    engine = compose_engine()
    engine.schedule(request(), computed=16, external=40)
    assert args_of("a", "update_state_after_alloc") == [("r1", BLOCK_IDS, 32)]
    assert args_of("b", "update_state_after_alloc") == [("r1", BLOCK_IDS, 8)]
    engine.schedule(request("r2"), computed=16, external=20)
    assert args_of("a", "update_state_after_alloc")[1] == ("r2", BLOCK_IDS, 20)
    assert args_of("b", "update_state_after_alloc")[1] == ("r2", BLOCK_IDS, 0)


def test_unknown_request_gets_zero_everywhere() -> None:
    mux = make(SCHEDULER, child("a", offer=32), child("b"))
    mux.update_state_after_alloc(request(), Blocks(BLOCK_IDS), 0)
    assert args_of("a", "update_state_after_alloc") == [("r1", BLOCK_IDS, 0)]
    assert args_of("b", "update_state_after_alloc") == [("r1", BLOCK_IDS, 0)]


def test_second_alloc_after_an_async_load_gives_everyone_zero() -> None:
    engine = compose_engine(a={"async": True})
    engine.schedule(request(), computed=16)
    engine.sched.update_state_after_alloc(request(), Blocks(BLOCK_IDS), 0)
    assert args_of("a", "update_state_after_alloc")[1] == ("r1", BLOCK_IDS, 0)
    assert args_of("b", "update_state_after_alloc")[1] == ("r1", BLOCK_IDS, 0)


def test_hit_sources_summed_over_contributors() -> None:
    engine = compose_engine()
    engine.schedule(request(), computed=16)
    sources = engine.sched.get_external_cache_hit_sources(request(), 48)
    assert sources == {ScriptedConnector._cache_hit_source: 48}
    assert engine.sched.get_external_cache_hit_sources(request("unknown"), 0) == {}


def test_loaded_groups_come_from_the_first_contributor() -> None:
    kv_cache_config = SimpleNamespace(prefix_cacheable_group_ids=(0,))
    config = vllm_config(child("a", offer=0), child("b", offer=32))
    mux = MuxConnector(config, SCHEDULER, kv_cache_config)
    assert mux.get_loaded_kv_cache_group_ids(request()) == (0,)  # no plan: the mux's own
    mux.get_num_new_matched_tokens(request(), 0)
    assert mux.get_loaded_kv_cache_group_ids(request()) == (0,)


def test_request_finished_all_groups_gives_non_hma_children_group_zero() -> None:
    mux = make(SCHEDULER, child("a", async_save=True), child("b", params={"k": 1}))
    assert mux.request_finished_all_groups(request(), ([1, 2], [3])) == (True, {"k": 1})
    assert args_of("a", "request_finished") == [("r1", [1, 2])]
    assert args_of("b", "request_finished") == [("r1", [1, 2])]


# -- metadata -----------------------------------------------------------------------------


def test_every_load_error_reaches_the_tiers_before_any_child_saves() -> None:
    """Child a fails block 101: b must not save what the forward pass computed over it."""
    engine = compose_engine(a={"load_errors": [101]})
    engine.schedule(request(), computed=16)
    scripted.ORDER.clear()
    step = engine.step()
    assert step.load_errors == {101}
    for name in ("a", "b"):
        assert args_of(name, "mux_drop_saves_over") == [({101},)]
        hooks = [hook for child, hook in scripted.ORDER if child == name]
        assert hooks.index("mux_drop_saves_over") < hooks.index("wait_for_save")


def test_no_load_error_no_drop() -> None:
    engine = compose_engine()
    engine.schedule(request(), computed=16)
    assert engine.step().load_errors == set()
    assert args_of("b", "mux_drop_saves_over") == []


def test_only_the_steps_loaders_are_asked_for_load_errors_before_the_saves() -> None:
    """b loads nothing this step: its load errors cannot be over blocks computed now."""
    engine = compose_engine(b={"offer": 0})
    engine.schedule(request(), computed=16)
    scripted.ORDER.clear()
    engine.step()
    before = {"a": [], "b": []}  # each child's hooks before the first wait_for_save
    for name, hook in scripted.ORDER:
        if hook == "wait_for_save":
            break
        before[name].append(hook)
    assert "get_block_ids_with_load_errors" in before["a"]
    assert "get_block_ids_with_load_errors" not in before["b"]
    assert len(args_of("b", "get_block_ids_with_load_errors")) == 1  # after the saves


def test_a_lone_tier_settles_its_own_load_errors() -> None:
    """A tier knows its own failed loads: alone, it is not asked before it saves."""
    engine = Engine(child("a", offer={16: 32}, offset_capable=True, load_errors=[101]))
    engine.schedule(request(), computed=16)
    scripted.ORDER.clear()
    assert engine.step().load_errors == {101}
    hooks = [hook for _, hook in scripted.ORDER]
    assert hooks.index("get_block_ids_with_load_errors") > hooks.index("wait_for_save")
    assert args_of("a", "mux_drop_saves_over") == []


def test_metadata_bound_to_each_child_in_order() -> None:
    engine = compose_engine()
    engine.schedule(request(), computed=16)
    meta = engine.meta()
    first, second = meta.children
    assert isinstance(first, ScriptedMetadata) and first.name == "a"
    assert isinstance(second, ScriptedMetadata) and second.name == "b"
    assert first.loads == [("r1", 32)] and second.loads == [("r1", 16)]
    scripted.ORDER.clear()
    engine.worker.bind_connector_metadata(meta)
    assert scripted.ORDER == [("a", "bind_connector_metadata"), ("b", "bind_connector_metadata")]
    assert args_of("a", "bind_connector_metadata", "WORKER") == [(first,)]
    assert args_of("b", "bind_connector_metadata", "WORKER") == [(second,)]
    assert engine.worker.has_connector_metadata()
    engine.worker.clear_connector_metadata()
    assert not engine.worker.has_connector_metadata()
    for c in engine.worker.children:
        assert not c.has_connector_metadata()


def test_every_child_gets_the_worker_hooks() -> None:
    engine = Engine(child("a"), child("b"))
    engine.step()
    for name in ("a", "b"):
        hooks = [c.hook for c in calls(name, role="WORKER")]
        assert hooks == [
            "__init__",
            "bind_connector_metadata",
            "start_load_kv",
            "wait_for_layer_load",
            "save_kv_layer",
            "wait_for_save",  # nothing loads this step: no load errors to settle before it
            "get_transfer_results",
            "get_block_ids_with_load_errors",
            "clear_connector_metadata",
        ]
        assert args_of(name, "start_load_kv") == [(FORWARD,)]
        assert args_of(name, "wait_for_layer_load") == [("layer.0",)]
        assert args_of(name, "save_kv_layer") == [("layer.0",)]


def test_per_layer_hooks_go_only_to_children_they_do_work_for() -> None:
    engine = Engine(child("a"), child("b"))
    a, b = engine.worker.children
    a.declare(layer_saves=False)  # e.g. a kvmux tier copying only its loads layer by layer
    b.declare(layer_loads=False)  # e.g. a kvmux tier copying whole steps
    engine.worker.register_kv_caches({"layer.0": KV_LAYER})  # children decide, the mux asks
    engine.step()
    assert args_of("a", "wait_for_layer_load") == [("layer.0",)]
    assert args_of("a", "save_kv_layer") == []
    assert args_of("b", "wait_for_layer_load") == args_of("b", "save_kv_layer") == []


def test_no_per_layer_calls_in_a_step_without_per_layer_work() -> None:
    engine = Engine(child("a"), child("b"))
    for c in engine.worker.children:
        c.declare(layer_loads=False)  # kvmux tiers copying whole steps
    engine.worker.register_kv_caches({"layer.0": KV_LAYER})
    engine.worker.bind_connector_metadata(engine.meta())
    assert not engine.worker.has_connector_metadata()  # vLLM skips both hooks per layer
    engine.worker.clear_connector_metadata()
    engine.step()
    for name in ("a", "b"):
        assert args_of(name, "bind_connector_metadata") != []
        assert args_of(name, "wait_for_layer_load") == args_of(name, "save_kv_layer") == []


def test_per_layer_calls_while_a_child_works_per_layer() -> None:
    engine = Engine(child("a"), child("b"))
    a, b = engine.worker.children
    a.declare(layer_saves=False)  # loads layer by layer, saves whole steps
    b.declare(layer_loads=False)
    engine.worker.register_kv_caches({"layer.0": KV_LAYER})
    engine.worker.bind_connector_metadata(engine.meta())
    assert engine.worker.has_connector_metadata()
    engine.worker.clear_connector_metadata()
    assert not engine.worker.has_connector_metadata()


def test_a_child_without_per_layer_work_this_step_gets_no_per_layer_calls() -> None:
    engine = Engine(child("a"), child("b"))
    a, b = engine.worker.children
    for c in (a, b):
        c.declare(layer_work_by_step=True)  # a kvmux tier: its answer is per step
    engine.worker.register_kv_caches({"layer.0": KV_LAYER})  # children decide, the mux asks
    a.has_connector_metadata = lambda: False  # e.g. a memory tier with no load this step
    engine.step()
    assert args_of("a", "wait_for_layer_load") == args_of("a", "save_kv_layer") == []
    assert args_of("b", "wait_for_layer_load") == [("layer.0",)]
    b.has_connector_metadata = lambda: False
    engine.worker.bind_connector_metadata(engine.meta())
    assert not engine.worker.has_connector_metadata()  # nobody: vLLM skips every layer
    engine.worker.clear_connector_metadata()


def test_a_child_that_cannot_say_whether_it_works_per_layer_is_called() -> None:
    engine = Engine(child("a"))
    (a,) = engine.worker.children

    def broken() -> bool:
        raise RuntimeError("no answer")

    a.declare(layer_work_by_step=True)
    engine.worker.register_kv_caches({"layer.0": KV_LAYER})
    a.has_connector_metadata = broken
    engine.step()
    assert args_of("a", "wait_for_layer_load") == [("layer.0",)]
    assert guard(engine.worker, 0).counters["errors"] == 0


def test_a_foreign_child_is_not_asked_whether_it_works_per_layer() -> None:
    engine = Engine(child("a"))  # as under MultiConnector: its hooks see no extra call
    (a,) = engine.worker.children
    asked: list[bool] = []
    a.has_connector_metadata = lambda: asked.append(True) or False
    engine.step()
    assert asked == []
    assert args_of("a", "wait_for_layer_load") == [("layer.0",)]


def test_handle_preemptions_passes_each_child_its_own_metadata() -> None:
    engine = Engine(child("a"), child("b"))
    meta = engine.meta()
    engine.worker.handle_preemptions(meta)  # base-class no-op on the children: must not fail
    assert guard(engine.worker, 0).counters["errors"] == 0


# -- async saves --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("saves", "expected"), [((False, False), False), ((True, False), True), ((True, True), True)]
)
def test_request_finished_async_when_any_child_saves_async(
    saves: tuple[bool, bool], expected: bool
) -> None:
    mux = make(SCHEDULER, child("a", async_save=saves[0]), child("b", async_save=saves[1]))
    assert mux.request_finished(request(), [100, 101]) == (expected, None)
    assert args_of("a", "request_finished") == [("r1", [100, 101])]
    assert args_of("b", "request_finished") == [("r1", [100, 101])]


def test_finished_sending_once_after_every_async_saver() -> None:
    engine = Engine(child("a", async_save=True), child("b", async_save=True))
    assert engine.sched.request_finished(request(), BLOCK_IDS) == (True, None)
    script("a")["finished_sending"] = ["r1"]
    step = engine.step(finished={"r1"})
    assert step.meta.plan.async_savers == {"r1": {0, 1}}
    assert step.results.finished_sending == set()
    assert args_of("a", "get_transfer_results") == [({"r1"},)]
    script("b")["finished_sending"] = ["r1"]
    script("a")["finished_sending"] = ["r1"]  # a duplicate
    assert engine.step().results.finished_sending == {"r1"}
    script("a")["finished_sending"] = ["r1"]
    script("b")["finished_sending"] = ["r1"]
    assert engine.step().results.finished_sending == set()
    assert engine.worker.work.sending.ignored == 3


def test_a_child_reporting_a_save_it_does_not_owe_is_ignored() -> None:
    engine = Engine(child("a", async_save=True), child("b", async_save=False))
    engine.sched.request_finished(request(), BLOCK_IDS)
    script("b")["finished_sending"] = ["r1", "stray"]
    assert engine.step().results.finished_sending == set()
    script("a")["finished_sending"] = ["r1"]
    assert engine.step().results.finished_sending == {"r1"}


def test_get_finished_reports_none_when_nothing_finished() -> None:
    engine = Engine(child("a", async_save=True))
    engine.sched.request_finished(request(), BLOCK_IDS)
    engine.worker.bind_connector_metadata(engine.meta())
    assert engine.worker.get_finished(set()) == (None, None)
    script("a")["finished_sending"] = ["r1"]
    assert engine.worker.get_finished({"r1"}) == ({"r1"}, None)


# -- async loads --------------------------------------------------------------------------


def test_async_load_reported_once_after_every_loader() -> None:
    engine = compose_engine(a={"async": True}, b={"async": True})
    assert engine.schedule(request(), computed=16) == (48, True)
    script("a")["finished_recving"] = ["r1"]
    step = engine.step()
    assert step.meta.plan.async_loaders == {"r1": {0, 1}}
    assert step.results.finished_recving == set()
    script("a")["finished_recving"] = ["r1"]  # duplicate from a
    script("b")["finished_recving"] = ["r1"]
    step = engine.step()
    assert step.results.finished_recving == {"r1"}
    assert step.results.failed_recving == set()
    script("a")["finished_recving"] = ["r1"]
    script("b")["finished_recving"] = ["r1"]
    assert engine.step().results.finished_recving == set()


def test_only_async_contributors_are_awaited() -> None:
    engine = compose_engine(a={"async": True})
    assert engine.schedule(request(), computed=16) == (48, True)
    script("b")["finished_recving"] = ["r1"]  # b loads synchronously: owes nothing
    step = engine.step()
    assert step.meta.plan.async_loaders == {"r1": {0}}
    assert step.results.finished_recving == set()
    script("a")["finished_recving"] = ["r1"]
    assert engine.step().results.finished_recving == {"r1"}


def test_a_child_reporting_a_load_it_does_not_owe_is_ignored() -> None:
    engine = Engine(child("a", offer=32, **{"async": True}), child("b"))
    engine.schedule(request(), computed=16)
    script("b")["finished_recving"] = ["r1", "stray"]
    assert engine.step().results.finished_recving == set()
    assert engine.worker.work.recving.ignored == 2
    script("a")["finished_recving"] = ["r1"]
    assert engine.step().results.finished_recving == {"r1"}


def test_failed_recving_propagated_after_every_loader() -> None:
    engine = compose_engine(a={"async": True}, b={"async": True})
    engine.schedule(request(), computed=16)
    script("a")["failed_recving"] = ["r1"]
    assert engine.step().results == KVConnectorTransferResults(set(), set(), set())
    script("b")["finished_recving"] = ["r1"]
    results = engine.step().results
    assert results.finished_recving == {"r1"}
    assert results.failed_recving == {"r1"}


def test_failing_async_loader_finishes_the_request_as_failed() -> None:
    engine = compose_engine(a={"async": True, "raise_in": ["start_load_kv"]}, b={"async": True})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.results.finished_recving == set()  # b still loading
    assert step.load_errors == {101, 102}
    script("b")["finished_recving"] = ["r1"]
    results = engine.step().results
    assert results.finished_recving == {"r1"}
    assert results.failed_recving == {"r1"}


def test_async_loader_whose_scheduler_meta_failed_does_not_hang_the_request() -> None:
    engine = Engine(child("a", offer=32, raise_in=["build_connector_meta"], **{"async": True}))
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.meta.children == (None,)
    assert step.meta.plan.failed_blocks == [101, 102]
    assert step.results.finished_recving == {"r1"}
    assert step.load_errors == {101, 102}


# -- load errors --------------------------------------------------------------------------


def test_load_errors_are_unioned_over_children() -> None:
    engine = Engine(child("a", load_errors=[3, 5]), child("b", load_errors=[5, 7]))
    assert engine.step().load_errors == {3, 5, 7}
    assert engine.step().load_errors == set()


@pytest.mark.parametrize("hook", ["start_load_kv", "wait_for_layer_load"])
def test_blocks_of_a_child_that_raised_in_a_load_hook_are_load_errors(hook: str) -> None:
    engine = compose_engine(a={"raise_in": [hook]}, b={"load_errors": [104]})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.load_errors == {101, 102, 104}  # a's blocks, plus b's own report
    assert args_of("b", "wait_for_layer_load") == [("layer.0",)]
    assert args_of("b", "wait_for_save") == [()]
    assert args_of("a", "wait_for_save") == []  # a failed loader saves nothing this step


def test_blocks_of_a_child_whose_scheduler_meta_failed_are_load_errors() -> None:
    engine = compose_engine(a={"raise_in": ["build_connector_meta"]})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.meta.children[0] is None
    assert isinstance(step.meta.children[1], ScriptedMetadata)
    assert step.meta.plan.load_blocks == {1: [103]}
    assert step.load_errors == {101, 102}
    assert args_of("a", "bind_connector_metadata", "WORKER") == []
    assert args_of("a", "start_load_kv") == []
    assert args_of("b", "start_load_kv") == [(FORWARD,)]


def test_blocks_of_a_child_whose_update_state_after_alloc_failed_are_load_errors() -> None:
    engine = compose_engine(b={"raise_in": ["update_state_after_alloc"]})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.meta.plan.failed_blocks == [103]
    assert step.load_errors == {103}
    assert guard(engine.sched, 0).hit_tokens == 32
    assert guard(engine.sched, 1).hit_tokens == 0


def test_blocks_of_a_child_that_failed_to_bind_are_load_errors() -> None:
    engine = compose_engine(a={"raise_in": ["bind_connector_metadata"]})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.load_errors == {101, 102}
    assert args_of("a", "start_load_kv") == []


def test_a_child_naming_its_loads_is_asked_for_them_only_when_it_fails() -> None:
    engine = compose_engine(a={"names_loads": [101, 102], "raise_in": ["start_load_kv"]})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.meta.plan.load_blocks == {0: None, 1: [103]}  # a's ids are in its metadata
    assert step.load_errors == {101, 102}


def test_a_child_naming_its_loads_without_metadata_has_them_read_from_its_blocks() -> None:
    engine = compose_engine(a={"names_loads": [999], "raise_in": ["build_connector_meta"]})
    engine.schedule(request(), computed=16)
    step = engine.step()
    assert step.meta.plan.failed_blocks == [101, 102]
    assert step.load_errors == {101, 102}


def test_a_cut_off_child_naming_its_loads_has_them_read_from_its_blocks(clock: Clock) -> None:
    engine = compose_engine(a={"names_loads": [999]})
    engine.schedule(request(), computed=16)
    guard(engine.sched, 0).force_open()
    meta = engine.meta()
    assert meta.plan.failed_blocks == [101, 102] and 0 not in meta.plan.load_blocks
    assert engine.step(meta=meta).load_errors == {101, 102}


def test_load_errors_reported_once() -> None:
    engine = compose_engine(a={"raise_in": ["start_load_kv"]})
    engine.schedule(request(), computed=16)
    assert engine.step().load_errors == {101, 102}
    assert engine.step().load_errors == set()


# -- failing children in every hook ------------------------------------------------------


@dataclass
class Scenario:
    """A mux with child "a" failing in ``hook``; ``fire`` calls the hook (again)."""

    mux: MuxConnector
    fire: Callable[[], Any]
    check: Callable[[Any], None]  # what the first fire returned shows "b" working
    role: str
    guarded: bool = True  # a data-path hook: skipped while the breaker is open


def _scheduler_scenario(hook: str) -> Scenario:
    a = child("a", raise_in=[hook], offer=32, async_save=True, params={"x": 1}, events=["e-a"])
    b = child("b", offer=16, async_save=True, params={"y": 2}, events=["e-b"])
    mux = make(SCHEDULER, a, b)
    req = request()

    def check_none(_: Any) -> None:
        pass

    if hook == "get_num_new_matched_tokens":

        def check(result: Any) -> None:
            assert result == (16, False)
            assert [c.child for c in mux.sched.contributions("r1")] == [1]

        return Scenario(mux, lambda: mux.get_num_new_matched_tokens(req, 0), check, "SCHEDULER")
    if hook == "update_state_after_alloc":
        mux.get_num_new_matched_tokens(req, 16)  # a loads 32 tokens
        script("b")["offer"] = 0

        def check(_: Any) -> None:
            assert args_of("b", hook)[0] == ("r1", BLOCK_IDS, 0)
            assert mux.build_connector_meta(None).plan.failed_blocks == [101, 102]

        fire = lambda: mux.update_state_after_alloc(req, Blocks(BLOCK_IDS), 32)  # noqa: E731
        return Scenario(mux, fire, check, "SCHEDULER")
    if hook == "build_connector_meta":

        def check(meta: Any) -> None:
            assert meta.children[0] is None
            assert isinstance(meta.children[1], ScriptedMetadata)
            assert meta.children[1].name == "b"

        return Scenario(mux, lambda: mux.build_connector_meta(None), check, "SCHEDULER")
    if hook == "request_finished":

        def check(result: Any) -> None:
            assert result == (True, {"y": 2})

        return Scenario(mux, lambda: mux.request_finished(req, BLOCK_IDS), check, "SCHEDULER")
    if hook == "update_connector_output":
        parts = (ScriptedWorkerMeta(frozenset({"a"})), ScriptedWorkerMeta(frozenset({"b"})))
        worker_meta = MuxWorkerMetadata(parts)
        output = KVConnectorOutput(kv_connector_worker_meta=worker_meta)

        def check(_: Any) -> None:
            assert args_of("b", hook)[0][1] == ScriptedWorkerMeta(frozenset({"b"}))
            assert output.kv_connector_worker_meta is worker_meta

        return Scenario(mux, lambda: mux.update_connector_output(output), check, "SCHEDULER")
    if hook == "take_events":

        def check(events: Any) -> None:
            assert events == ["e-b"]

        return Scenario(mux, lambda: list(mux.take_events()), check, "SCHEDULER")
    raise AssertionError(hook)


def _worker_scenario(hook: str) -> Scenario:
    engine = compose_engine(a={"raise_in": [hook], "async_save": True}, b={"load_errors": [9]})
    engine.schedule(request(), computed=16)
    engine.sched.request_finished(request("saved"), BLOCK_IDS)
    script("b")["async_save"] = True
    engine.sched.request_finished(request("b-saved"), BLOCK_IDS)
    first_meta = engine.meta()
    w = engine.worker
    metas = iter([first_meta])

    def bind() -> None:
        w.bind_connector_metadata(next(metas, None) or engine.meta())

    def on_bound(call: Callable[[], Any]) -> Callable[[], Any]:
        def fire() -> Any:
            bind()
            return call()

        return fire

    def check_b_called(_: Any) -> None:
        assert calls("b", hook, "WORKER")

    if hook == "bind_connector_metadata":

        def check(_: Any) -> None:
            assert args_of("b", hook, "WORKER")[0] == (first_meta.children[1],)
            assert w.get_block_ids_with_load_errors() == {101, 102, 9}

        return Scenario(w, bind, check, "WORKER")
    if hook in ("start_load_kv", "wait_for_layer_load"):
        call = {
            "start_load_kv": lambda: w.start_load_kv(FORWARD),
            "wait_for_layer_load": lambda: w.wait_for_layer_load("layer.0"),
        }[hook]

        def check(_: Any) -> None:
            check_b_called(None)
            assert w.get_block_ids_with_load_errors() == {101, 102, 9}

        return Scenario(w, on_bound(call), check, "WORKER")
    if hook in ("save_kv_layer", "wait_for_save"):
        call = {
            "save_kv_layer": lambda: w.save_kv_layer("layer.0", KV_LAYER, ATTN),
            "wait_for_save": lambda: w.wait_for_save(),
        }[hook]

        def check(_: Any) -> None:
            check_b_called(None)
            assert guard(w, 0).counters["save_errors"] == 1
            assert guard(w, 1).counters["save_errors"] == 0

        return Scenario(w, on_bound(call), check, "WORKER")
    if hook == "get_transfer_results":
        bind()
        script("b")["finished_sending"] = ["b-saved"]

        def check(result: Any) -> None:
            # a raised: its sends stay owed (it may still read their blocks), so neither
            # "saved" (a's alone) nor "b-saved" (b reported its share) is finished yet
            assert result.finished_sending == set()

        return Scenario(w, lambda: w.get_transfer_results(set()), check, "WORKER")
    if hook == "get_block_ids_with_load_errors":
        script("a")["load_errors"] = [1]

        def check(result: Any) -> None:
            assert result == {9}

        return Scenario(w, w.get_block_ids_with_load_errors, check, "WORKER")
    if hook == "build_connector_worker_meta":
        script("a")["worker_meta"] = {"a"}
        script("b")["worker_meta"] = {"b"}

        def check(result: Any) -> None:
            assert isinstance(result, MuxWorkerMetadata)
            assert result.children == (None, ScriptedWorkerMeta(frozenset({"b"})))
            assert result.open_children == frozenset({0})

        return Scenario(w, w.build_connector_worker_meta, check, "WORKER")
    if hook == "shutdown":
        return Scenario(w, w.shutdown, check_b_called, "WORKER", guarded=False)
    raise AssertionError(hook)


SCHEDULER_HOOKS = [
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "request_finished",
    "update_connector_output",
    "take_events",
]
WORKER_HOOKS = [
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "build_connector_worker_meta",
    "shutdown",
]


DATA_PATH = {  # the hooks an open breaker skips; every other hook always runs
    "get_num_new_matched_tokens",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
}


def scenario(hook: str) -> Scenario:
    s = _scheduler_scenario(hook) if hook in SCHEDULER_HOOKS else _worker_scenario(hook)
    s.guarded = hook in DATA_PATH
    return s


@pytest.mark.parametrize("hook", SCHEDULER_HOOKS + WORKER_HOOKS)
def test_failing_child_never_propagates_and_trips_its_breaker(hook: str) -> None:
    s = scenario(hook)
    result = s.fire()  # must not raise
    s.check(result)
    assert len(args_of("a", hook, s.role)) == 1
    assert calls("b", hook, s.role)
    a, b = guard(s.mux, 0), guard(s.mux, 1)
    assert a.counters["errors"] == 1
    assert a.breaker.state == "open"
    assert not a.breaker.allow()
    assert a.snapshot()["breaker_open"] == 1.0
    assert a.snapshot()["breaker_trips"] == 1.0
    assert b.counters["errors"] == 0
    assert b.breaker.state == "closed"


@pytest.mark.parametrize("hook", sorted(set(SCHEDULER_HOOKS + WORKER_HOOKS) - DATA_PATH))
def test_lifecycle_and_completion_hooks_run_past_an_open_breaker(hook: str) -> None:
    """Skipping them would leak the child's state or misreport its transfers."""
    s = scenario(hook)
    s.fire()
    assert guard(s.mux, 0).breaker.state == "open"
    s.fire()
    assert len(args_of("a", hook, s.role)) == 2
    assert guard(s.mux, 0).counters["skipped_calls"] == 0


@pytest.mark.parametrize("hook", sorted(DATA_PATH))
def test_open_breaker_skips_the_data_path_until_the_backoff_passed(hook: str, clock: Clock) -> None:
    s = scenario(hook)
    s.fire()
    b_calls = len(calls("b", hook, s.role))
    s.fire()
    assert len(args_of("a", hook, s.role)) == 1  # skipped while open
    assert len(calls("b", hook, s.role)) > b_calls  # the other child keeps working
    assert guard(s.mux, 0).counters["skipped_calls"] >= 1
    script("a")["raise_in"] = []
    clock.advance(BREAKER)
    assert guard(s.mux, 0).breaker.state == "half-open"
    s.fire()
    assert len(args_of("a", hook, s.role)) == 2
    assert guard(s.mux, 0).counters["errors"] == 1
    assert guard(s.mux, 0).breaker.state == "closed"


def test_shutdown_reaches_every_child_even_with_an_open_breaker() -> None:
    mux = make(WORKER, child("a", raise_in=["shutdown"]), child("b"))
    mux.shutdown()
    mux.shutdown()
    assert len(args_of("a", "shutdown")) == 2
    assert len(args_of("b", "shutdown")) == 2
    assert guard(mux, 0).counters["errors"] == 2


def test_failing_lookup_offers_zero_and_others_keep_loading() -> None:
    engine = compose_engine(a={"raise_in": ["get_num_new_matched_tokens"]}, b={"offer": 32})
    assert engine.schedule(request(), computed=16) == (32, False)
    assert args_of("b", "get_num_new_matched_tokens") == [("r1", 16)]
    assert engine.step().meta.plan.load_blocks == {1: [101, 102]}


def test_failure_in_a_hook_outside_the_step_still_counts() -> None:
    mux = make(SCHEDULER, child("a", raise_in=["reset_cache", "get_finished_count"]), child("b"))
    assert mux.reset_cache() is False
    assert guard(mux, 0).counters["errors"] == 1
    assert args_of("b", "reset_cache") == [()]


def test_open_breaker_cuts_a_child_off_the_data_path_only(clock: Clock) -> None:
    engine = compose_engine(a={"raise_in": ["start_load_kv"]})
    engine.schedule(request(), computed=16)
    engine.step()
    assert guard(engine.worker, 0).breaker.state == "open"
    before = len(calls("a", role="WORKER"))
    engine.step()
    later = [c.hook for c in calls("a", role="WORKER")[before:]]
    assert later == [
        "bind_connector_metadata",
        "get_transfer_results",
        "get_block_ids_with_load_errors",
        "clear_connector_metadata",
    ]  # bound, but no load or save; completion hooks still run
    assert guard(engine.worker, 0).counters["skipped_calls"] >= 1


def test_sends_of_a_failing_child_are_held_then_given_up(clock: Clock) -> None:
    """Never reported finished while the child may still read the blocks; not held for ever."""
    engine = compose_engine(a={"async_save": True, "raise_in": ["get_transfer_results"]})
    engine.sched.request_finished(request("saved"), BLOCK_IDS)
    assert engine.step().results.finished_sending == set()
    clock.advance(30)
    assert engine.step().results.finished_sending == set()
    clock.advance(31)  # past breaker_max_seconds (60 s) of failing reports
    assert engine.step().results.finished_sending == {"saved"}
    assert engine.step().results.finished_sending == set()  # once


def test_sends_complete_when_a_failing_child_reports_again(clock: Clock) -> None:
    engine = compose_engine(a={"async_save": True, "raise_in": ["get_transfer_results"]})
    engine.sched.request_finished(request("saved"), BLOCK_IDS)
    assert engine.step().results.finished_sending == set()
    script("a")["raise_in"] = []
    script("a")["finished_sending"] = ["saved"]
    assert engine.step().results.finished_sending == {"saved"}


def test_a_cut_off_child_still_builds_its_step_and_loses_its_loads(clock: Clock) -> None:
    """No plan outlives its step: the child builds it, and it is dropped, not replayed."""
    engine = compose_engine()
    engine.schedule(request(), computed=16)  # a loads blocks 101, 102
    guard(engine.sched, 0).force_open()
    meta = engine.meta()
    assert len(args_of("a", "build_connector_meta")) == 1
    assert meta.plan.cut_off == {0}
    assert meta.plan.failed_blocks == [101, 102]
    assert engine.step(meta=meta).load_errors == {101, 102}
    assert args_of("a", "start_load_kv") == [] and args_of("a", "wait_for_save") == []
    assert len(args_of("a", "bind_connector_metadata", "WORKER")) == 1


def test_a_child_cut_off_between_lookup_and_alloc_loads_nothing(clock: Clock) -> None:
    engine = compose_engine()
    sched = engine.sched
    assert sched.get_num_new_matched_tokens(request(), 16) == (48, False)
    guard(sched, 0).force_open()
    sched.update_state_after_alloc(request(), Blocks(BLOCK_IDS), 48)
    assert args_of("a", "update_state_after_alloc") == [("r1", BLOCK_IDS, 0)]
    assert args_of("b", "update_state_after_alloc") == [("r1", BLOCK_IDS, 16)]
    assert engine.meta().plan.failed_blocks == [101, 102]


def test_lifecycle_hooks_reach_a_cut_off_child(clock: Clock) -> None:
    engine = compose_engine()
    for mux in (engine.sched, engine.worker):
        guard(mux, 0).force_open()
    engine.sched.request_finished(request(), BLOCK_IDS)
    engine.worker.handle_preemptions(engine.meta())
    assert len(args_of("a", "request_finished")) == 1
    assert len(args_of("a", "handle_preemptions")) == 1


def test_worker_breaker_opens_the_scheduler_breaker(clock: Clock) -> None:
    engine = compose_engine(a={"raise_in": ["start_load_kv"]})
    engine.schedule(request(), computed=16)
    engine.step()
    worker_meta = engine.worker.build_connector_worker_meta()
    assert isinstance(worker_meta, MuxWorkerMetadata)
    assert worker_meta.open_children == frozenset({0})
    engine.sched.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=worker_meta))
    assert guard(engine.sched, 0).breaker.state == "open"
    assert guard(engine.sched, 1).breaker.state == "closed"
    assert engine.sched.get_num_new_matched_tokens(request("r2"), 16) == (0, False)
    assert args_of("a", "get_num_new_matched_tokens") == [("r1", 16)]  # not asked for r2
    clock.advance(BREAKER)
    assert guard(engine.sched, 0).breaker.allow()


# -- kv_transfer_params, layouts, events, counts, reset ---------------------------------


def test_transfer_params_merged_across_children() -> None:
    mux = make(
        SCHEDULER,
        child("a", params={"x": 1}),
        child("b", params=None),
        child("c", params={"y": {"z": 2}}),
    )
    assert mux.request_finished(request(), BLOCK_IDS) == (False, {"x": 1, "y": {"z": 2}})


def test_transfer_params_key_clash_names_both_children() -> None:
    mux = make(SCHEDULER, child("a", params={"x": 1}), child("b", params={"x": 2, "y": 3}))
    with pytest.raises(TransferParamsClash) as info:
        mux.request_finished(request(), BLOCK_IDS)
    message = str(info.value)
    assert A in message and B in message
    assert "'x'" in message


def test_required_layout_consistent() -> None:
    config = vllm_config(child("a", layout="HND"), child("b"), child("c", layout="HND"))
    assert MuxConnector.get_required_kvcache_layout(config) == "HND"
    assert MuxConnector.get_required_kvcache_layout(vllm_config(child("a"), child("b"))) is None


def test_required_layout_mismatch_names_both_children() -> None:
    config = vllm_config(child("a", layout="HND"), child("b", layout="NHD"))
    with pytest.raises(ConfigError) as info:
        MuxConnector.get_required_kvcache_layout(config)
    message = str(info.value)
    assert f"{A} needs HND" in message
    assert f"{B} needs NHD" in message


def test_take_events_concatenates_in_child_order() -> None:
    mux = make(SCHEDULER, child("a", events=["a1", "a2"]), child("b", events=["b1"]))
    assert list(mux.take_events()) == ["a1", "a2", "b1"]
    assert list(mux.take_events()) == []


@pytest.mark.parametrize(
    ("counts", "expected"), [((2, 2), 2), ((None, 2), None), ((2, None), None), ((1,), 1)]
)
def test_get_finished_count(counts: tuple[int | None, ...], expected: int | None) -> None:
    names = "ab"[: len(counts)]
    mux = make(WORKER, *(child(n, finished_count=c) for n, c in zip(names, counts, strict=True)))
    assert mux.get_finished_count() == expected


def test_get_finished_count_mismatch() -> None:
    mux = make(WORKER, child("a", finished_count=1), child("b", finished_count=2))
    with pytest.raises(ConfigError):
        mux.get_finished_count()


@pytest.mark.parametrize(
    ("answers", "expected"),
    [((True, True), True), ((True, None), True), ((False, True), False), ((None, None), True)],
)
def test_reset_cache(answers: tuple[bool | None, bool | None], expected: bool) -> None:
    mux = make(SCHEDULER, child("a", reset=answers[0]), child("b", reset=answers[1]))
    assert mux.reset_cache() is expected
    assert args_of("a", "reset_cache") == [()] and args_of("b", "reset_cache") == [()]


def test_requires_piecewise_for_cudagraph_with_explicit_roles() -> None:
    plain = {**child("a"), "kv_role": "kv_both"}
    piecewise = {**child("b", piecewise=True), "kv_role": "kv_both"}
    assert MuxConnector.requires_piecewise_for_cudagraph({"connectors": [plain]}) is False
    assert MuxConnector.requires_piecewise_for_cudagraph({"connectors": [plain, piecewise]})


def test_requires_piecewise_for_cudagraph_with_inherited_roles() -> None:
    assert MuxConnector.requires_piecewise_for_cudagraph({"connectors": [child("a")]}) is False
    tiers = {"tiers": [{"type": "memory", "capacity": "1MiB"}]}
    assert MuxConnector.requires_piecewise_for_cudagraph(tiers) is False
    both = {"connectors": [child("a", piecewise=True)], **tiers}
    assert MuxConnector.requires_piecewise_for_cudagraph(both) is True


# -- update_connector_output and worker metadata ----------------------------------------


def test_update_connector_output_hands_each_child_its_worker_meta() -> None:
    mux = make(SCHEDULER, child("a"), child("b"))
    worker_meta = MuxWorkerMetadata((None, ScriptedWorkerMeta(frozenset({"b"}))))
    output = KVConnectorOutput(finished_sending={"r1"}, kv_connector_worker_meta=worker_meta)
    mux.update_connector_output(output)
    (a_out, a_meta), (b_out, b_meta) = (
        args_of("a", "update_connector_output")[0],
        args_of("b", "update_connector_output")[0],
    )
    assert a_out is output and b_out is output
    assert a_meta is None
    assert b_meta == ScriptedWorkerMeta(frozenset({"b"}))
    assert output.kv_connector_worker_meta is worker_meta
    assert guard(mux, 0).breaker.state == "closed"


def test_a_tier_that_reads_only_its_worker_meta_is_not_called_without_it() -> None:
    mux = make(SCHEDULER, child("tier", needs_meta=True), child("other"))
    mux.update_connector_output(KVConnectorOutput())
    assert args_of("tier", "update_connector_output") == []
    assert [meta for _, meta in args_of("other", "update_connector_output")] == [None]
    tagged = ScriptedWorkerMeta(frozenset({"t"}))
    for parts in ((None, tagged), (tagged, None)):
        mux.update_connector_output(
            KVConnectorOutput(kv_connector_worker_meta=MuxWorkerMetadata(parts))
        )
    assert [meta for _, meta in args_of("tier", "update_connector_output")] == [tagged]
    assert [meta for _, meta in args_of("other", "update_connector_output")] == [None, tagged, None]


def test_take_events_skips_a_tier_that_publishes_none() -> None:
    mux = make(
        SCHEDULER,
        child("silent", publishes_events=False, events=["never"]),
        child("loud", publishes_events=True, events=["e1"]),
        child("foreign", events=["e2"]),
    )
    assert list(mux.take_events()) == ["e1", "e2"]
    assert calls("silent", "take_events") == []


def test_update_connector_output_without_worker_meta() -> None:
    mux = make(SCHEDULER, child("a"), child("b"))
    output = KVConnectorOutput()
    mux.update_connector_output(output)
    assert args_of("a", "update_connector_output")[0][1] is None
    assert args_of("b", "update_connector_output")[0][1] is None
    assert output.kv_connector_worker_meta is None


def test_build_connector_worker_meta() -> None:
    mux = make(WORKER, child("a"), child("b"))
    assert mux.build_connector_worker_meta() is None
    script("b")["worker_meta"] = ["x"]
    assert mux.build_connector_worker_meta() == MuxWorkerMetadata(
        (None, ScriptedWorkerMeta(frozenset({"x"}))), frozenset()
    )


def test_worker_metadata_names_a_child_cut_off_even_when_no_child_has_metadata() -> None:
    mux = make(WORKER, child("a"), child("b"))
    script("a")["raise_in"] = ["build_connector_worker_meta"]
    assert mux.build_connector_worker_meta() == MuxWorkerMetadata((None, None), frozenset({0}))


def test_mux_worker_metadata_aggregate() -> None:
    def tags(*t: str) -> ScriptedWorkerMeta:
        return ScriptedWorkerMeta(frozenset(t))

    one = MuxWorkerMetadata((tags("a1"), None, tags("c1")), frozenset({0}))
    two = MuxWorkerMetadata((tags("a2"), tags("b2"), None), frozenset({2}))
    merged = one.aggregate(two)
    assert merged == MuxWorkerMetadata(
        (tags("a1", "a2"), tags("b2"), tags("c1")), frozenset({0, 2})
    )
    assert one.aggregate(MuxWorkerMetadata((None, None, None))).children == one.children
    with pytest.raises(ValueError):
        one.aggregate(MuxWorkerMetadata((None,)))


# -- stats --------------------------------------------------------------------------------


def test_stats_per_child_keyed_by_label() -> None:
    engine = Engine(child("a", offer=32, stats={"hits": 3}), child("b", stats={"hits": 5}))
    engine.schedule(request(), computed=16)
    stats = engine.sched.get_kv_connector_stats()
    assert isinstance(stats, MuxConnectorStats)
    assert set(stats.children()) == {A, B}
    assert isinstance(stats.data[A], ScriptedStats)  # the child's own object
    assert stats.data[A].data == {"hits": 3}
    counters = stats.counters()
    assert counters[A]["lookups"] == 1.0
    assert counters[A]["hit_tokens"] == 32.0
    assert counters[B]["hit_tokens"] == 0.0
    reduced = stats.reduce()
    assert reduced[A] == {"hits": 3}  # reduced by the child's own class
    assert reduced[B] == {"hits": 5}
    assert reduced["mux"][A]["hit_tokens"] == 32.0


def test_a_childs_averages_are_never_summed_across_intervals_or_workers() -> None:
    """Two workers, two intervals each, of a child that reports a mean transfer time."""
    workers = [make(WORKER, child("a", stats={"ms": [1000, 2000]})) for _ in range(2)]
    intervals = [w.get_kv_connector_stats() for w in workers for _ in range(2)]
    total = MuxConnector.build_kv_connector_stats(None)
    for interval in intervals:
        assert interval is not None
        # as vLLM sends them to its front end: plain data, rebuilt there by the mux's class
        total.aggregate(MuxConnector.build_kv_connector_stats(interval.to_dict()))
    assert isinstance(total.data[A], ScriptedStats)
    assert total.reduce()[A] == {"avg_ms": 1500.0}


def test_stats_reset_each_interval() -> None:
    mux = make(SCHEDULER, child("a", offer=32), child("b"))
    mux.get_num_new_matched_tokens(request(), 0)
    assert mux.get_kv_connector_stats() is not None
    assert mux.get_kv_connector_stats() is None  # nothing moved since


def test_stats_count_errors_and_the_breaker() -> None:
    mux = make(WORKER, child("a", raise_in=["wait_for_save"]), child("b"))
    mux.wait_for_save()  # no metadata bound: nobody is saving, nothing is called
    assert args_of("a", "wait_for_save") == []
    mux.bind_connector_metadata(MuxMetadata((None, None)))
    mux.get_block_ids_with_load_errors()
    script("a")["raise_in"] = ["get_block_ids_with_load_errors"]
    mux.get_block_ids_with_load_errors()
    stats = mux.get_kv_connector_stats()
    assert stats is not None
    counters = stats.counters()
    assert counters[A]["errors"] == 1.0
    assert counters[A]["breaker_open"] == 1.0
    assert counters[A]["breaker_trips"] == 1.0
    assert counters[B]["errors"] == 0.0
    assert counters[B]["breaker_open"] == 0.0


def test_stats_payload_round_trip_rebuilds_each_child_by_its_class() -> None:
    mux = make(WORKER, child("a", stats={"hits": 2}), child("b"))
    stats = mux.get_kv_connector_stats()
    assert stats is not None
    payload = stats.to_dict()
    assert payload[A]["stats"] == {"hits": 2}
    assert payload[A]["connector"] == f"{scripted.MODULE}:ScriptedConnector"
    rebuilt = MuxConnector.build_kv_connector_stats(payload)
    assert isinstance(rebuilt.data[A], ScriptedStats)
    assert rebuilt.counters() == payload["mux"]
    assert rebuilt.to_dict() == payload
    assert MuxConnector.build_kv_connector_stats(None).is_empty()
    rebuilt.reset()
    assert rebuilt.is_empty()


def test_stats_of_an_unknown_connector_class_are_dropped_not_fatal() -> None:
    payload = {
        A: {"connector": "no.such.module:Gone", "stats": {"hits": 1}},
        B: {"connector": "builtins:dict", "stats": {"hits": 1}},  # not a connector
        "mux": {A: {"lookups": 1}},
    }
    rebuilt = MuxConnector.build_kv_connector_stats(payload)
    assert rebuilt.children() == {}
    assert rebuilt.counters() == {A: {"lookups": 1}}


def test_mux_counters_aggregate_gauges_by_max() -> None:
    one = MuxConnector.build_kv_connector_stats({"mux": {A: {"lookups": 2, "breaker_open": 1.0}}})
    two = MuxConnector.build_kv_connector_stats(
        {"mux": {A: {"lookups": 3, "breaker_open": 0.0}, B: {"errors": 1}}}
    )
    merged = one.aggregate(two)
    assert merged is one
    assert one.counters() == {A: {"lookups": 5, "breaker_open": 1.0}, B: {"errors": 1}}
    assert not one.is_empty()
    assert MuxConnector.build_kv_connector_stats({"mux": {A: {"lookups": 0}}}).is_empty()


def test_two_workers_of_two_same_class_children_stay_apart() -> None:
    workers = [make(WORKER, child("a", load_errors=[1]), child("b")) for _ in range(2)]
    for w in workers:
        w.bind_connector_metadata(MuxMetadata((None, None)))
        w.save_kv_layer("layer.0", KV_LAYER, ATTN)  # nobody bound: nothing saved
    script("a")["raise_in"] = ["get_block_ids_with_load_errors"]
    for w in workers:
        w.get_block_ids_with_load_errors()
    first, second = (w.get_kv_connector_stats() for w in workers)
    assert first is not None and second is not None
    total = first.aggregate(second)
    assert isinstance(total, MuxConnectorStats)
    counters = total.counters()
    assert counters[A]["errors"] == 2.0
    assert counters[B]["errors"] == 0.0
    assert counters[A]["breaker_open"] == 1.0


# -- regressions: src bugs this suite found (fixed in src while it was written) ------------


def test_clear_connector_metadata_unbinds_a_child_that_failed_to_load() -> None:
    engine = compose_engine(a={"raise_in": ["start_load_kv"]})
    engine.schedule(request(), computed=16)
    engine.step()
    a = engine.worker.children[0]
    assert args_of("a", "bind_connector_metadata", "WORKER")
    assert not a.has_connector_metadata()


def test_load_failure_counts_a_load_error() -> None:
    engine = compose_engine(a={"raise_in": ["start_load_kv"]})
    engine.schedule(request(), computed=16)
    engine.step()
    assert guard(engine.worker, 0).snapshot()["load_errors"] >= 1


def test_breaker_trips_are_counted_once_across_intervals() -> None:
    mux = make(SCHEDULER, child("a", raise_in=["take_events"]), child("b"))
    list(mux.take_events())
    first = mux.get_kv_connector_stats()
    second = mux.get_kv_connector_stats()
    assert first is not None
    total = first if second is None else first.aggregate(second)
    assert isinstance(total, MuxConnectorStats)
    assert total.counters()[A]["breaker_trips"] == 1.0


def test_mux_counters_are_reported_at_most_once_an_interval_and_none_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [50.0]
    monkeypatch.setattr(mux_stats.time, "monotonic", lambda: now[0])
    mux = make(SCHEDULER, child("a", offer=32), child("b"))
    reports = []
    for i in range(5):
        mux.get_num_new_matched_tokens(request(f"r{i}"), 0)
        reports.append(mux.get_kv_connector_stats())
        now[0] += mux_stats.COUNTERS_SECONDS / 2
    reports.append(mux.get_kv_connector_stats())
    sent = [r for r in reports if r is not None]
    assert len(sent) == 3  # at 50, 51 and 52 s: one each interval, not one each step
    assert sum(r.counters()[A]["lookups"] for r in sent) == 5.0  # later, never lost
    assert mux.child_counters()[A]["lookups"] == 5.0


def test_a_finished_request_sends_the_counters_with_its_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine may go idle after its last request: nothing is left unreported then."""
    monkeypatch.setattr(mux_stats.time, "monotonic", lambda: 50.0)
    mux = make(SCHEDULER, child("a", offer=32), child("b"))
    mux.get_num_new_matched_tokens(request("r0"), 0)
    assert mux.get_kv_connector_stats() is not None  # the first report of the interval
    mux.get_num_new_matched_tokens(request("r1"), 0)
    assert mux.get_kv_connector_stats() is None  # within the interval: later
    mux.request_finished(request("r1"), BLOCK_IDS)
    stats = mux.get_kv_connector_stats()  # within the interval, yet sent
    assert stats is not None
    assert stats.counters()[A]["lookups"] == 1.0


def test_counters_wait_for_their_interval_while_other_requests_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finish with requests still running is not the engine's last step: no report yet."""
    monkeypatch.setattr(mux_stats.time, "monotonic", lambda: 50.0)
    mux = make(SCHEDULER, child("a", offer=32), child("b"))
    for name in ("r0", "r1", "r2"):
        mux.on_new_request(request(name))
    mux.get_num_new_matched_tokens(request("r0"), 0)
    assert mux.get_kv_connector_stats() is not None  # the first report of the interval
    mux.get_num_new_matched_tokens(request("r1"), 0)
    mux.request_finished(request("r0"), BLOCK_IDS)
    assert mux.get_kv_connector_stats() is None  # r1 and r2 still run: later
    mux.request_finished(request("r1"), BLOCK_IDS)
    assert mux.get_kv_connector_stats() is None
    mux.request_finished(request("r2"), BLOCK_IDS)  # the last one: the engine may idle
    stats = mux.get_kv_connector_stats()
    assert stats is not None
    assert stats.counters()[A]["lookups"] == 1.0
    mux.on_new_request(request("r3"))  # counting starts again from none
    mux.get_num_new_matched_tokens(request("r3"), 0)
    mux.request_finished(request("r3"), BLOCK_IDS)
    assert mux.get_kv_connector_stats() is not None


def test_an_error_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mux_stats.time, "monotonic", lambda: 50.0)
    mux = make(SCHEDULER, child("a", raise_in=["take_events"]), child("b"))
    assert mux.get_kv_connector_stats() is None  # nothing moved yet
    list(mux.take_events())
    stats = mux.get_kv_connector_stats()  # within the interval, yet sent
    assert stats is not None
    assert stats.counters()[A]["errors"] == 1.0
    assert stats.counters()[A]["breaker_open"] == 1.0


def test_hooks_the_base_class_leaves_empty_reach_only_children_that_override_them() -> None:
    mux = make(SCHEDULER, child("a"), child("b"))
    assert mux._roster.listening("on_new_request") == ()  # ScriptedConnector: no override
    assert [m.connector for m in mux._roster.listening("take_events")] == mux.children
    mux.on_new_request(request())
    assert mux.has_pending_push_work() is False


@pytest.mark.parametrize("hook", mux_module.BASE_NO_OPS)
def test_the_base_class_hooks_skipped_do_nothing_in_this_vllm(hook: str) -> None:
    """A later vLLM whose base hook did something would need it called: this test says."""
    source = textwrap.dedent(inspect.getsource(getattr(KVConnectorBase_V1, hook)))
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    body = [
        s
        for s in function.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    assert len(body) == 1 and isinstance(body[0], ast.Return | ast.Pass), hook
    value = body[0].value if isinstance(body[0], ast.Return) else None
    assert value is None or isinstance(value, ast.Constant) or ast.unparse(value) == "()", hook


def test_error_in_child_stats_is_reported() -> None:
    mux = make(SCHEDULER, child("a", raise_in=["get_kv_connector_stats"]), child("b"))
    first = mux.get_kv_connector_stats()
    assert guard(mux, 0).breaker.state == "open"
    second = mux.get_kv_connector_stats()
    reported = sum(s.counters()[A]["errors"] for s in (first, second) if s is not None)
    assert reported == 2.0  # stats are asked for past an open breaker too: both errors count


# -- several KV cache groups: load failures go per request ------------------------------


def hybrid_child(name: str, **script: Any) -> dict[str, Any]:
    """A scripted child that supports several KV cache groups."""
    return {**child(name, **script), "kv_connector": "ScriptedHMAConnector"}


class HybridEngine(Engine):
    """An Engine whose model has two KV cache groups."""

    def __init__(self, *children: dict[str, Any], **extra: Any):
        two_groups = SimpleNamespace(kv_cache_groups=[object(), object()])
        self.sched = MuxConnector(vllm_config(*children, **extra), SCHEDULER, two_groups)
        self.worker = MuxConnector(vllm_config(*children, **extra), WORKER, two_groups)
        self.output = SimpleNamespace(finished_req_ids=set())


def hybrid_compose(a: dict[str, Any] | None = None, b: dict[str, Any] | None = None) -> Engine:
    """As compose_engine, over two KV cache groups: a loads [16, 48), b loads [48, 64)."""
    return HybridEngine(
        hybrid_child("a", **{"offer": {16: 32}, "offset_capable": True, **(a or {})}),
        hybrid_child("b", **{"offer": {48: 16}, "offset_capable": True, **(b or {})}),
        policy="compose",
    )


def test_several_groups_take_only_asynchronous_offers(caplog: pytest.LogCaptureFixture) -> None:
    """vLLM takes a hybrid model's load failures only per request: a synchronous load
    could fail only as block ids, which stop vLLM 0.32, so it is declined (once logged)."""
    engine = HybridEngine(
        hybrid_child("a", offer=32), hybrid_child("b", offer=16, **{"async": True})
    )
    assert engine.schedule(request(), computed=16) == (16, True)  # b's, though a offers more
    assert args_of("a", "update_state_after_alloc") == [("r1", BLOCK_IDS, 0)]
    engine.schedule(request("r2"), computed=16)
    assert sum("synchronous loads" in r.getMessage() for r in caplog.records) == 1


def test_several_groups_fail_the_request_not_its_blocks_when_a_loader_raises() -> None:
    engine = hybrid_compose(a={"async": True, "raise_in": ["start_load_kv"]}, b={"async": True})
    engine.schedule(request(), computed=16)
    assert engine.step().load_errors == set()  # never block ids: vLLM would stop
    script("b")["finished_recving"] = ["r1"]
    results = engine.step().results
    assert results.finished_recving == {"r1"}
    assert results.failed_recving == {"r1"}


def test_several_groups_fail_the_request_of_a_loader_cut_off_before_alloc(
    clock: Clock,
) -> None:
    engine = hybrid_compose(a={"async": True}, b={"async": True})
    assert engine.sched.get_num_new_matched_tokens(request(), 16) == (48, True)
    guard(engine.sched, 0).force_open()
    engine.sched.update_state_after_alloc(request(), Blocks(BLOCK_IDS), 48)
    step = engine.step()
    assert step.meta.plan.failed_loads == {"r1"}
    assert step.load_errors == set()
    script("b")["finished_recving"] = ["r1"]
    results = engine.step().results
    assert (results.finished_recving, results.failed_recving) == ({"r1"}, {"r1"})


def test_several_groups_fail_the_request_of_a_child_cut_off_at_its_step(clock: Clock) -> None:
    engine = HybridEngine(hybrid_child("a", offer=32, **{"async": True}))
    engine.schedule(request(), computed=16)
    guard(engine.sched, 0).force_open()
    step = engine.step()
    assert step.meta.plan.failed_loads == {"r1"}
    assert step.load_errors == set()
    assert (step.results.finished_recving, step.results.failed_recving) == ({"r1"}, {"r1"})


def test_one_group_keeps_block_level_failures_for_a_cut_off_child(clock: Clock) -> None:
    """With one group, vLLM keeps the prefix below failed blocks: no request fails."""
    engine = Engine(child("a", offer=32, **{"async": True}))
    engine.schedule(request(), computed=16)
    guard(engine.sched, 0).force_open()
    step = engine.step()
    assert step.load_errors == {101, 102}
    assert (step.results.finished_recving, step.results.failed_recving) == ({"r1"}, set())
