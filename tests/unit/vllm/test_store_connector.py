"""StoreConnector's scheduler half on stand-in engine configs: counters, keys, namespace."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput

from kvmux.config import parse_store_spec
from kvmux.errors import ConfigError
from kvmux.keys import block_keys, namespace_id, store_key
from kvmux.stores import DiskStore
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, TierStepPlan
from kvmux.vllm import StoreConnector, store_connector
from kvmux.vllm.engine_config import engine_namespace
from kvmux.vllm.metadata import StoreConnectorMetadata, StoreWorkerMetadata
from kvmux.vllm.store_connector import loads_async

BLOCK = 16


class Blocks:
    """A KVCacheBlocks stand-in: one list of block ids per KV cache group."""

    def __init__(self, ids: list[int], *more_groups: list[int]):
        self.groups = (ids, *more_groups)

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple(list(ids) for ids in self.groups)


def _attention(window: int | None = None, block_size: int = BLOCK) -> KVCacheSpec:
    """A full-attention layer spec, or a sliding-window one of ``window`` tokens."""
    shape = {"block_size": block_size, "num_kv_heads": 2, "head_size": 8, "dtype": torch.float32}
    if window is None:
        return FullAttentionSpec(**shape)
    return SlidingWindowSpec(**shape, sliding_window=window)


def _engine(
    store: dict[str, Any], specs: tuple[KVCacheSpec, ...] | None = None
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A stand-in engine with one KV cache group per spec (two layers each)."""
    ktc = KVTransferConfig(
        kv_connector="StoreConnector",
        kv_connector_module_path="kvmux.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"store": store},
    )
    vllm_config = SimpleNamespace(
        kv_transfer_config=ktc,
        model_config=SimpleNamespace(
            model="unit-model",
            revision=None,
            hf_config=SimpleNamespace(),
            dtype="float32",
            use_mla=False,
            get_total_num_kv_heads=lambda: 2,
            get_total_num_hidden_layers=lambda: 2 * len(specs or (None,)),
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(cache_dtype="auto"),
    )
    specs = specs or (_attention(),)
    groups = [
        SimpleNamespace(kv_cache_spec=spec, layer_names=[f"layer.{g}", f"layer.{g + len(specs)}"])
        for g, spec in enumerate(specs)
    ]
    return vllm_config, SimpleNamespace(kv_cache_groups=groups, num_blocks=64)


def scheduler(
    store: dict[str, Any], specs: tuple[KVCacheSpec, ...] | None = None
) -> StoreConnector:
    vllm_config, kv_cache_config = _engine(store, specs)
    return StoreConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)  # type: ignore[arg-type]


def fake_request(req_id: str, tokens: int, **fields: Any) -> SimpleNamespace:
    """The fields of a vLLM Request that kvmux reads; ``fields`` override them."""
    request = SimpleNamespace(
        request_id=req_id,
        prompt_token_ids=list(range(1, tokens + 1)),
        num_prompt_tokens=tokens,
        lora_request=None,
        cache_salt=None,
        mm_features=[],
        prompt_embeds=None,
        _prompt_embeds_per_block_hashes={},
        kv_transfer_params=None,
    )
    request.__dict__.update(fields)
    return request


def look_up(connector: StoreConnector, req_id: str, tokens: int, **fields: Any) -> int | None:
    request = fake_request(req_id, tokens, **fields)
    hit, _ = connector.get_num_new_matched_tokens(request, 0)  # type: ignore[arg-type]
    connector.update_state_after_alloc(request, Blocks(list(range(1, 9))), hit or 0)  # type: ignore[arg-type]
    return hit


MEMORY = {"type": "memory", "capacity": "1MiB"}  # both tiers take the default name "memory"
DISK = {"type": "disk", "path": "/nonexistent/kvmux", "capacity": "1MiB"}  # only parsed


def test_two_tiers_of_one_name_keep_their_own_counters() -> None:
    one, other = scheduler(MEMORY), scheduler(MEMORY)
    assert one.tier_name == other.tier_name == "memory"
    look_up(one, "a", 5 * BLOCK)
    look_up(one, "b", 5 * BLOCK)
    assert one.stats.snapshot()["lookups"] == 2
    assert other.stats.snapshot()["lookups"] == 0


def test_the_scheduler_half_reports_its_own_counters_once() -> None:
    connector = scheduler(MEMORY)
    assert connector.get_kv_connector_stats() is None
    look_up(connector, "a", 5 * BLOCK)
    stats = connector.get_kv_connector_stats()
    assert stats is not None
    assert stats.reduce()["lookups"] == 1
    assert stats.reduce()["hit_tokens"] == 0
    assert connector.get_kv_connector_stats() is None  # nothing new since
    connector.shutdown()


def test_a_request_kvmux_cannot_key_is_neither_loaded_nor_saved() -> None:
    connector = scheduler(MEMORY)
    odd = {
        "mm_features": [
            SimpleNamespace(identifier=1.5, mm_position=SimpleNamespace(offset=0, length=4))
        ]
    }
    assert look_up(connector, "odd", 3 * BLOCK, **odd) == 0
    assert connector.stats.snapshot()["unkeyable_requests"] == 1
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="odd", num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={"odd": 3 * BLOCK},
        kv_connector_block_state=SimpleNamespace(get_block_ids=lambda _: ([1, 2, 3],)),
    )
    meta = connector.build_connector_meta(output)  # type: ignore[arg-type]
    assert meta.plan.saves == []  # type: ignore[attr-defined]


def test_quantization_and_checkpoint_are_in_the_namespace(tmp_path: Path) -> None:
    vllm_config, kv_cache_config = _engine(MEMORY)
    base = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    vllm_config.model_config.quantization = "fp8"
    quantized = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    assert base["quantization"] == "None" and quantized["quantization"] == "fp8"
    assert namespace_id(base) != namespace_id(quantized)
    assert base["checkpoint"] == "revision:None"


def test_an_epoch_moves_the_namespace() -> None:
    plain, first = scheduler(MEMORY), scheduler({**MEMORY, "epoch": "first"})
    assert (
        len({plain._namespace, first._namespace, scheduler({**MEMORY, "epoch": "2"})._namespace})
        == 3
    )
    assert scheduler({**MEMORY, "epoch": "first"})._namespace == first._namespace


# -- hybrid models: several KV cache groups -------------------------------------------

HYBRID = (_attention(), _attention(window=2 * BLOCK))  # full attention, a 2-block window


def _step(req_id: str, computed: int, scheduled: int, *groups: list[int]) -> SimpleNamespace:
    """A SchedulerOutput stand-in: one new request and its blocks, per group."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=req_id, num_computed_tokens=computed)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={req_id: scheduled},
        kv_connector_block_state=SimpleNamespace(get_block_ids=lambda _: tuple(groups)),
    )


def _idle() -> SimpleNamespace:
    """A SchedulerOutput stand-in of a step that schedules nothing."""
    return SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={},
        kv_connector_block_state=None,
    )


def _moves(transfers: list[Any]) -> list[tuple[int, int]]:
    return [(t.group, t.block_id) for t in transfers]


def test_the_store_connector_supports_the_hybrid_kv_cache_manager() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

    vllm_config, _ = _engine(MEMORY)
    assert supports_hma(StoreConnector)
    assert KVConnectorFactory.supports_hma_config(vllm_config.kv_transfer_config)


def test_a_one_group_model_keeps_its_namespace() -> None:
    vllm_config, kv_cache_config = _engine(MEMORY)
    namespace = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    assert "kv_cache_groups" not in namespace
    assert (namespace["kv_spec"], namespace["num_layers"]) == ("FullAttentionSpec", 2)


def test_a_hybrid_namespace_names_every_group() -> None:
    vllm_config, one = _engine(MEMORY)
    _, two = _engine(MEMORY, HYBRID)
    namespace = engine_namespace(vllm_config, two)  # type: ignore[arg-type]
    groups = namespace["kv_cache_groups"]
    assert [g["sliding_window"] for g in groups] == [0, 2 * BLOCK]
    assert [g["layers"] for g in groups] == [["layer.0", "layer.2"], ["layer.1", "layer.3"]]
    assert namespace_id(namespace) != namespace_id(engine_namespace(vllm_config, one))  # type: ignore[arg-type]


def test_a_mamba_group_is_refused_at_start_naming_its_kind() -> None:
    mamba = MambaSpec(block_size=BLOCK, shapes=((4, 4),), dtypes=(torch.float32,))
    with pytest.raises(ConfigError, match=r"KV cache group 1 .* is Mamba \(recurrent state"):
        scheduler(MEMORY, (_attention(), mamba))


def test_groups_of_different_block_sizes_are_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="one block size"):
        scheduler(MEMORY, (_attention(), _attention(window=4 * BLOCK, block_size=2 * BLOCK)))


def test_every_group_is_restored_by_a_load() -> None:
    assert scheduler(MEMORY).get_loaded_kv_cache_group_ids(fake_request("a", 1)) == (0,)  # type: ignore[arg-type]
    hybrid = scheduler(MEMORY, HYBRID)
    assert hybrid.get_loaded_kv_cache_group_ids(fake_request("a", 1)) == (0, 1)  # type: ignore[arg-type]


def test_a_hybrid_prompt_is_saved_per_group_and_loaded_within_the_window() -> None:
    connector = scheduler(MEMORY, HYBRID)
    first = fake_request("a", 5 * BLOCK + 1)
    assert connector.get_num_new_matched_tokens(first, 0) == (0, False)  # type: ignore[arg-type]
    connector.update_state_after_alloc(first, Blocks([], []), 0)  # type: ignore[arg-type]
    step = _step("a", 0, 5 * BLOCK + 1, [1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16])
    saves = connector.build_connector_meta(step).plan.saves  # type: ignore[arg-type, attr-defined]
    pairs = [(0, 1), (1, 11), (0, 2), (1, 12), (0, 3), (1, 13), (0, 4), (1, 14), (0, 5), (1, 15)]
    assert _moves(saves) == pairs
    assert len({t.key for t in saves}) == 10  # a group's block never shares a key
    done = connector.request_finished_all_groups(first, ([1, 2, 3, 4, 5, 6], [0, 0, 0, 14, 15, 16]))  # type: ignore[arg-type]
    assert done == (False, None)

    second = fake_request("b", 5 * BLOCK + 1)
    hit, is_async = connector.get_num_new_matched_tokens(second, 0)  # type: ignore[arg-type]
    assert (hit, is_async) == (5 * BLOCK, True)  # several groups: every load is asynchronous
    # the window of the hit's next token covers blocks 3 and 4: below it, the null block
    blocks = Blocks([21, 22, 23, 24, 25, 26], [0, 0, 0, 34, 35, 36])
    connector.update_state_after_alloc(second, blocks, hit)  # type: ignore[arg-type]
    plan = connector.build_connector_meta(_idle()).plan  # type: ignore[arg-type, attr-defined]
    assert plan.loads == [] and plan.saves == []
    (load,) = plan.async_loads
    assert (load.req_id, load.start) == ("b", 0)
    assert _moves(load.transfers) == [(0, 21), (0, 22), (0, 23), (0, 24), (1, 34), (0, 25), (1, 35)]
    connector.update_state_after_alloc(second, blocks, 0)  # type: ignore[arg-type]  # loaded
    step = _step("b", 5 * BLOCK, 1, *blocks.get_block_ids())
    plan = connector.build_connector_meta(step).plan  # type: ignore[arg-type, attr-defined]
    assert plan.loads == plan.saves == plan.async_loads == []


def test_a_finished_hybrid_request_is_forgotten() -> None:
    connector = scheduler(MEMORY, HYBRID)
    request = fake_request("a", 3 * BLOCK)
    connector.get_num_new_matched_tokens(request, 0)  # type: ignore[arg-type]
    connector.request_finished_all_groups(request, ([1, 2, 3], [4, 5, 6]))  # type: ignore[arg-type]
    step = _step("a", 0, 3 * BLOCK, [1, 2, 3], [4, 5, 6])
    assert connector.build_connector_meta(step).plan.saves == []  # type: ignore[arg-type, attr-defined]


# -- asynchronous loads ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "mode", "groups", "expected"),
    [
        ("memory", "auto", 1, False),
        ("disk", "auto", 1, True),
        ("redis", "auto", 1, True),
        ("memory", "always", 1, True),
        ("disk", "never", 1, False),
        ("memory", "auto", 2, True),
        ("memory", "never", 2, True),  # overridden, with a warning: see below
    ],
)
def test_which_tiers_load_asynchronously(kind: str, mode: str, groups: int, expected: bool) -> None:
    spec = {"memory": MEMORY, "disk": DISK, "redis": {"type": "redis", "url": "redis://x"}}[kind]
    parsed = parse_store_spec({**spec, "async_loads": mode})
    assert loads_async(parsed, groups) is expected


def test_never_is_overridden_for_a_hybrid_model_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    connector = scheduler({**MEMORY, "async_loads": "never"}, HYBRID)
    assert connector.may_load_async(fake_request("a", 1))  # type: ignore[arg-type]
    assert "async_loads 'never' overridden" in caplog.text


def test_a_bad_async_loads_value_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"store\.async_loads.*accepted: always, auto, never"):
        scheduler({**MEMORY, "async_loads": "sometimes"})


def test_a_disk_hit_is_answered_asynchronously_and_a_miss_never_is(tmp_path: Path) -> None:
    disk = {"type": "disk", "path": str(tmp_path / "disk"), "capacity": "1MiB"}
    connector = scheduler(disk)
    first = fake_request("a", 3 * BLOCK + 1)
    # a miss is never asynchronous: vLLM asserts that an async load has tokens
    assert connector.get_num_new_matched_tokens(first, 0) == (0, False)  # type: ignore[arg-type]
    connector.update_state_after_alloc(first, Blocks([]), 0)  # type: ignore[arg-type]
    plan = connector.build_connector_meta(_step("a", 0, 3 * BLOCK + 1, [1, 2, 3, 4])).plan  # type: ignore[arg-type, attr-defined]
    store = DiskStore(tmp_path / "disk", 2**20)
    for transfer in plan.saves:  # what the workers would write (the lookup only stats files)
        store.put(store_key(transfer.key, 0), b"entry")
    second = fake_request("b", 3 * BLOCK + 1)
    assert connector.get_num_new_matched_tokens(second, 0) == (3 * BLOCK, True)  # type: ignore[arg-type]
    assert connector.may_load_async(second)  # type: ignore[arg-type]


def test_a_failed_load_reported_by_the_workers_is_not_offered_again() -> None:
    connector = scheduler({**MEMORY, "async_loads": "always"})
    first = fake_request("a", 4 * BLOCK + 1)
    connector.get_num_new_matched_tokens(first, 0)  # type: ignore[arg-type]
    connector.update_state_after_alloc(first, Blocks([]), 0)  # type: ignore[arg-type]
    connector.build_connector_meta(_step("a", 0, 4 * BLOCK + 1, [1, 2, 3, 4, 5]))  # type: ignore[arg-type]
    assert look_up(connector, "b", 4 * BLOCK + 1) == 4 * BLOCK
    meta = StoreWorkerMetadata(set(), {"b": 2})
    connector.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=meta))
    assert look_up(connector, "b", 4 * BLOCK + 1) == 2 * BLOCK  # below the failed block
    assert look_up(connector, "c", 4 * BLOCK + 1) == 4 * BLOCK  # other requests: all of it


def test_worker_metadata_keeps_each_requests_earliest_failure() -> None:
    one = StoreWorkerMetadata({b"k1"}, {"a": 3, "b": 1})
    other = StoreWorkerMetadata({b"k2"}, {"a": 2, "c": 5})
    merged = one.aggregate(other)
    assert merged == StoreWorkerMetadata({b"k1", b"k2"}, {"a": 2, "b": 1, "c": 5})


def worker(
    monkeypatch: pytest.MonkeyPatch, store: dict[str, Any], specs: tuple[KVCacheSpec, ...] | None
) -> StoreConnector:
    """A worker half over stand-in KV caches of every group's layers."""
    monkeypatch.setattr(store_connector, "_parallel_ranks", lambda: (0, 0))
    vllm_config, kv_cache_config = _engine(store, specs)
    connector = StoreConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)  # type: ignore[arg-type]
    names = sorted(n for g in kv_cache_config.kv_cache_groups for n in g.layer_names)
    connector.register_kv_caches({name: torch.zeros(64, 2, BLOCK, 16) for name in names})
    return connector


def _missing_load(req_id: str, groups: int) -> StoreConnectorMetadata:
    """A step plan with one async load of two positions the tier does not hold."""
    keys = block_keys(namespace_id({"unit": 1}), list(range(2 * BLOCK)), BLOCK)
    positions = tuple(
        tuple(BlockTransfer(k, 10 * (g + 1) + i, g) for g in range(groups))
        for i, k in enumerate(keys)
    )
    return StoreConnectorMetadata(TierStepPlan(async_loads=[RequestLoad(req_id, 3, positions)]))


def _run_step(connector: StoreConnector, meta: StoreConnectorMetadata) -> None:
    connector.bind_connector_metadata(meta)
    connector.start_load_kv(None)  # type: ignore[arg-type]
    connector.wait_for_save()
    connector.clear_connector_metadata()


def _results_until_finished(connector: StoreConnector) -> KVConnectorTransferResults:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        results = connector.get_transfer_results(set())
        if results.finished_recving:
            return results
        assert connector.get_block_ids_with_load_errors() == set()  # nothing before the finish
        time.sleep(0.001)
    raise AssertionError("the load never finished")


def test_one_group_reports_a_failed_load_as_blocks_in_its_finishing_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connector = worker(monkeypatch, MEMORY, None)
    _run_step(connector, _missing_load("r", 1))
    results = _results_until_finished(connector)
    assert (results.finished_recving, results.failed_recving) == ({"r"}, set())
    assert connector.get_block_ids_with_load_errors() == {10, 11}  # vLLM keeps the prefix
    meta = connector.build_connector_worker_meta()
    assert isinstance(meta, StoreWorkerMetadata) and meta.failed_loads == {"r": 3}
    assert connector.get_transfer_results(set()) == KVConnectorTransferResults()
    connector.shutdown()


def test_several_groups_report_a_failed_load_as_a_failed_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM stops on block ids from a model with several KV cache groups: never send any."""
    connector = worker(monkeypatch, MEMORY, HYBRID)
    _run_step(connector, _missing_load("r", 2))
    results = _results_until_finished(connector)
    assert (results.finished_recving, results.failed_recving) == ({"r"}, {"r"})
    assert connector.get_block_ids_with_load_errors() == set()
    meta = connector.build_connector_worker_meta()
    assert isinstance(meta, StoreWorkerMetadata) and meta.failed_loads == {"r": 3}
    connector.shutdown()


def test_the_metadata_names_every_block_it_loads() -> None:
    """What a MuxConnector names as load errors if this tier fails: sync and async loads."""
    key = block_keys(namespace_id({"unit": 1}), list(range(16)), 16)[0]
    sync = [BlockTransfer(key, 7), BlockTransfer(key, 8, group=1)]
    late = RequestLoad("r2", 0, ((BlockTransfer(key, 11),), (BlockTransfer(key, 12),)))
    meta = StoreConnectorMetadata(TierStepPlan(loads=sync, async_loads=[late]))
    assert StoreConnector.mux_load_blocks(meta) == [7, 8, 11, 12]
    assert StoreConnector.mux_load_blocks(StoreConnectorMetadata()) == []


def _allocating(
    new: dict[str, list[int]], cached: dict[str, list[int] | None], tokens: int
) -> SimpleNamespace:
    """A SchedulerOutput stand-in: new requests with all their blocks, cached ones with
    their new blocks (None: none), each scheduling ``tokens`` from 0."""
    tables = {**new, **{r: ids or [] for r, ids in cached.items()}}
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, num_computed_tokens=0, block_ids=(ids,))
            for r, ids in new.items()
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(cached),
            num_computed_tokens=[0] * len(cached),
            new_block_ids=[None if ids is None else (ids,) for ids in cached.values()],
        ),
        num_scheduled_tokens=dict.fromkeys(tables, tokens),
        kv_connector_block_state=SimpleNamespace(get_block_ids=lambda r: (tables[r],)),
    )


def test_on_a_gpu_a_saved_block_given_to_another_request_is_fenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_connector, "saves_copy_async", lambda: True)
    connector = scheduler(MEMORY)
    look_up(connector, "a", 2 * BLOCK + 1)
    first = connector.build_connector_meta(_allocating({"a": [1, 2, 3]}, {}, 2 * BLOCK + 1))  # type: ignore[arg-type]
    assert isinstance(first, StoreConnectorMetadata)
    assert [t.block_id for t in first.plan.saves] == [1, 2] and first.plan.fence == 0
    connector.request_finished(fake_request("a", 2 * BLOCK + 1), [1, 2, 3])  # type: ignore[arg-type]
    steps = [({"b": [7, 8]}, {"c": None}), ({}, {"c": [9]}), ({"d": [4]}, {"c": [2]})]
    fences = []
    for new, cached in steps:
        meta = connector.build_connector_meta(_allocating(new, cached, 1))  # type: ignore[arg-type]
        assert isinstance(meta, StoreConnectorMetadata)
        fences.append(meta.plan.fence)
    assert fences == [0, 0, 1]  # block 2, saved in step 1, goes to request c in step 4


def test_on_the_host_nothing_is_fenced(monkeypatch: pytest.MonkeyPatch) -> None:
    connector = scheduler(MEMORY)
    look_up(connector, "a", 2 * BLOCK + 1)
    connector.build_connector_meta(_allocating({"a": [1, 2, 3]}, {}, 2 * BLOCK + 1))  # type: ignore[arg-type]
    meta = connector.build_connector_meta(_allocating({"b": [1, 2]}, {}, 1))  # type: ignore[arg-type]
    assert isinstance(meta, StoreConnectorMetadata) and meta.plan.fence == 0


def test_binding_a_plan_fences_the_forward_pass_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connector = worker(monkeypatch, MEMORY, None)
    assert connector.work is not None
    fenced: list[TierStepPlan] = []
    monkeypatch.setattr(connector.work.worker, "fence", fenced.append)
    plan = TierStepPlan(step=7, fence=5)
    connector.bind_connector_metadata(StoreConnectorMetadata(plan))
    assert fenced == [plan]
    connector.shutdown()


def test_a_parent_may_skip_the_calls_that_would_do_nothing() -> None:
    connector = scheduler(MEMORY)  # no KV events published
    assert connector.mux_capabilities().publishes_events is False
    assert list(connector.take_events()) == []
    assert connector.mux_capabilities().output_needs_meta is True
    connector.update_connector_output(KVConnectorOutput(invalid_block_ids={1}))  # nothing to do


@pytest.mark.parametrize(
    ("by_layer", "loads", "expected"),
    [
        (False, True, False),
        (True, False, False),
        (True, True, True),
    ],
)
def test_per_layer_calls_only_for_a_step_loading_layer_by_layer(
    monkeypatch: pytest.MonkeyPatch, by_layer: bool, loads: bool, expected: bool
) -> None:
    connector = worker(monkeypatch, MEMORY, None)
    assert connector.work is not None
    by_layer_property = property(lambda _: by_layer)
    monkeypatch.setattr(type(connector.work.worker), "copies_by_layer", by_layer_property)
    key = block_keys(namespace_id({"unit": 1}), list(range(BLOCK)), BLOCK)[0]
    plan = TierStepPlan(loads=[BlockTransfer(key, 1, 0)] if loads else [])
    assert not connector.has_connector_metadata()  # nothing bound
    connector.bind_connector_metadata(StoreConnectorMetadata(plan))
    assert connector.has_connector_metadata() is expected  # vLLM's gate of the layer hooks
    connector.clear_connector_metadata()
    assert not connector.has_connector_metadata()
    connector.shutdown()
