"""kvmux.vllm.entry_layout and the namespace: which engines share entries, which never do."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

from kvmux.keys import namespace_id
from kvmux.vllm.engine_config import engine_namespace, engine_shards
from kvmux.vllm.entry_layout import HEADS, PER_RANK, REPLICATED, entry_layout

MODEL_HEADS = 8


def _spec(tp: int, heads: int = MODEL_HEADS, **fields: Any) -> FullAttentionSpec:
    local = max(1, heads // tp)
    return FullAttentionSpec(
        block_size=16, num_kv_heads=local, head_size=128, dtype=torch.bfloat16, **fields
    )


def _engine(tp: int, specs: list[Any], mla: bool = False, dcp: int = 1) -> tuple[Any, Any]:
    model = SimpleNamespace(
        model="unit-model",
        revision=None,
        hf_config=SimpleNamespace(),
        dtype="bfloat16",
        use_mla=mla,
        get_total_num_kv_heads=lambda: MODEL_HEADS,
        get_total_num_hidden_layers=lambda: 2,
    )
    parallel = SimpleNamespace(
        tensor_parallel_size=tp,
        pipeline_parallel_size=1,
        decode_context_parallel_size=dcp,
        prefill_context_parallel_size=1,
    )
    vllm_config = SimpleNamespace(
        model_config=model,
        parallel_config=parallel,
        cache_config=SimpleNamespace(cache_dtype="auto"),
    )
    groups = [
        SimpleNamespace(kv_cache_spec=spec, layer_names=[f"layer.{i}", f"layer.{i + len(specs)}"])
        for i, spec in enumerate(specs)
    ]
    return vllm_config, SimpleNamespace(kv_cache_groups=groups, num_blocks=64)


def _namespace(tp: int, specs: list[Any], **engine: Any) -> bytes:
    return namespace_id(engine_namespace(*_engine(tp, specs, **engine)))


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_per_head_entries_share_one_namespace_at_every_tp_size(tp: int) -> None:
    assert entry_layout(*_engine(tp, [_spec(tp)])).name == HEADS
    assert _namespace(tp, [_spec(tp)]) == _namespace(1, [_spec(1)])
    assert engine_shards(*_engine(tp, [_spec(tp)])).per_block == MODEL_HEADS


def test_mla_is_one_replicated_shard_and_shares_across_tp_sizes() -> None:
    def mla(tp: int) -> list[Any]:
        return [
            MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
        ]

    assert entry_layout(*_engine(4, mla(4), mla=True)).name == REPLICATED
    shards = [engine_shards(*_engine(4, mla(4), mla=True), tp_rank=r) for r in range(4)]
    assert [s.writes for s in shards] == [True, False, False, False]
    assert {s.per_block for s in shards} == {1}
    assert _namespace(4, mla(4), mla=True) == _namespace(1, mla(1), mla=True)


@pytest.mark.parametrize(
    ("why", "engine"),
    [
        ("context", lambda: _engine(16, [_spec(16)], dcp=2)),
        ("num_head_slots", lambda: _engine(2, [replace(_spec(2), num_head_slots=2)])),
        ("page_size_padded", lambda: _engine(2, [replace(_spec(2), page_size_padded=1 << 20)])),
        ("different numbers", lambda: _engine(2, [_spec(2), _spec(2, heads=4)])),
    ],
)
def test_what_cannot_be_cut_by_head_is_one_entry_per_rank_bound_to_the_tp_size(
    why: str, engine: Any
) -> None:
    vllm_config, kv_cache_config = engine()
    layout = entry_layout(vllm_config, kv_cache_config)
    assert layout.name == PER_RANK and why in layout.reason
    tp = vllm_config.parallel_config.tensor_parallel_size
    shards = [engine_shards(vllm_config, kv_cache_config, tp_rank=r) for r in range(tp)]
    assert [s.shard(0) for s in shards] == list(range(tp))  # each rank its own entry
    assert all(s.writes and s.per_block == tp for s in shards)
    assert engine_namespace(vllm_config, kv_cache_config)["tensor_parallel_size"] == tp


def test_a_group_of_layers_of_different_shapes_is_described_as_the_scheduler_sees_it() -> None:
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    first, second = _spec(2), _spec(2, heads=4)
    uniform = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": first, "b": second})
    worker = namespace_id(engine_namespace(*_engine(2, [uniform])))
    scheduler = namespace_id(engine_namespace(*_engine(2, [first])))
    assert worker == scheduler
    assert engine_shards(*_engine(2, [uniform])) == engine_shards(*_engine(2, [first]))
