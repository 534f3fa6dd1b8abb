"""StoreConnector's scheduler half on stand-in engine configs: counters, keys, namespace."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from kvmux.errors import ConfigError
from kvmux.keys import namespace_id
from kvmux.vllm import StoreConnector
from kvmux.vllm.engine_config import checkpoint_identity, engine_namespace

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
            model="unit-model", revision=None, hf_config=SimpleNamespace(), dtype="float32"
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
    )
    request.__dict__.update(fields)
    return request


def look_up(connector: StoreConnector, req_id: str, tokens: int, **fields: Any) -> int | None:
    request = fake_request(req_id, tokens, **fields)
    hit, _ = connector.get_num_new_matched_tokens(request, 0)  # type: ignore[arg-type]
    connector.update_state_after_alloc(request, Blocks(list(range(1, 9))), hit or 0)  # type: ignore[arg-type]
    return hit


MEMORY = {"type": "memory", "capacity": "1MiB"}  # both tiers take the default name "memory"


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


def test_checkpoint_identity_follows_the_weight_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 10)
    first = checkpoint_identity(str(tmp_path), None)
    assert checkpoint_identity(str(tmp_path), None) == first
    (tmp_path / "notes.txt").write_text("not weights")
    assert checkpoint_identity(str(tmp_path), None) == first
    weights.write_bytes(b"b" * 11)  # weights rewritten in place
    assert checkpoint_identity(str(tmp_path), None) != first
    assert checkpoint_identity("org/model", "abc123") == "revision:abc123"


def test_quantization_and_checkpoint_are_in_the_namespace(tmp_path: Path) -> None:
    vllm_config, kv_cache_config = _engine(MEMORY)
    base = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    vllm_config.model_config.quantization = "fp8"
    quantized = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    assert base["quantization"] == "None" and quantized["quantization"] == "fp8"
    assert namespace_id(base) != namespace_id(quantized)
    assert base["checkpoint"] == "revision:None"


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
    hit, _ = connector.get_num_new_matched_tokens(second, 0)  # type: ignore[arg-type]
    assert hit == 5 * BLOCK
    # the window of the hit's next token covers blocks 3 and 4: below it, the null block
    blocks = Blocks([21, 22, 23, 24, 25, 26], [0, 0, 0, 34, 35, 36])
    connector.update_state_after_alloc(second, blocks, hit)  # type: ignore[arg-type]
    step = _step("b", 5 * BLOCK, 1, *blocks.get_block_ids())
    plan = connector.build_connector_meta(step).plan  # type: ignore[arg-type, attr-defined]
    assert _moves(plan.loads) == [(0, 21), (0, 22), (0, 23), (0, 24), (1, 34), (0, 25), (1, 35)]
    assert plan.saves == []


def test_a_finished_hybrid_request_is_forgotten() -> None:
    connector = scheduler(MEMORY, HYBRID)
    request = fake_request("a", 3 * BLOCK)
    connector.get_num_new_matched_tokens(request, 0)  # type: ignore[arg-type]
    connector.request_finished_all_groups(request, ([1, 2, 3], [4, 5, 6]))  # type: ignore[arg-type]
    step = _step("a", 0, 3 * BLOCK, [1, 2, 3], [4, 5, 6])
    assert connector.build_connector_meta(step).plan.saves == []  # type: ignore[arg-type, attr-defined]
