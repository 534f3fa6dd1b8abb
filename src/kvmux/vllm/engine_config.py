"""What kvmux reads from the engine's config, and the one setting it changes there.

The namespace names everything about an engine that changes the bytes of a KV block.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from blake3 import blake3

from kvmux.errors import ConfigError
from kvmux.tier.shards import BlockShards
from kvmux.tier.worker.save_queue import SaveQueueSizing, host_memory_bytes
from kvmux.tier.worker.slab import ROW_ALIGN
from kvmux.vllm.checkpoint import checkpoint_identity
from kvmux.vllm.entry_layout import HEADS, PER_RANK, EntryLayout, entry_layout, group_spec

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = [
    "block_size_of",
    "engine_namespace",
    "engine_shards",
    "group_windows",
    "prefer_recompute",
    "save_queue_sizing",
    "saves_copy_async",
    "slab_slot_bytes",
]


_SUPPORTED_KINDS = "full attention, sliding-window attention"


def _layer_window(spec: Any) -> int | str | None:
    """None for full attention, a sliding window's tokens, or the name of a kind kvmux refuses."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    if type(spec) in (FullAttentionSpec, MLAAttentionSpec):
        return None
    if isinstance(spec, SlidingWindowSpec) and spec.prefix_cacheable:
        return int(spec.sliding_window) + int(spec.extra_retained_tokens)
    if isinstance(spec, MambaSpec):
        return f"Mamba (recurrent state, {type(spec).__name__})"
    return type(spec).__name__


def _layers(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return f"layers {shown}, ..." if len(names) > 3 else f"layers {shown}"


def group_windows(kv_cache_config: KVCacheConfig) -> list[int | None]:
    """Per KV cache group: None (full attention) or its sliding window in tokens.

    Raises ConfigError, naming the group's kind, for a group kvmux cannot store.
    """
    from vllm.v1.kv_cache_interface import iter_layer_specs

    windows: list[int | None] = []
    for index, group in enumerate(kv_cache_config.kv_cache_groups):
        found = {_layer_window(spec) for spec in iter_layer_specs(group.kv_cache_spec)}
        kind = found.pop() if len(found) == 1 else f"mixed layers {sorted(map(str, found))}"
        if isinstance(kind, str):
            where = f"KV cache group {index} ({_layers(group.layer_names)})"
            raise ConfigError(
                "model", f"{where} is {kind}: kvmux cannot store this kind", _SUPPORTED_KINDS
            )
        windows.append(kind)
    return windows


def block_size_of(kv_cache_config: KVCacheConfig) -> int:
    """Tokens per block of the engine's KV cache (the same in every group)."""
    sizes = {int(g.kv_cache_spec.block_size) for g in kv_cache_config.kv_cache_groups}
    if len(sizes) != 1:
        raise ConfigError(
            "model", f"kvmux needs one block size in every KV cache group, this model has {sizes}"
        )
    return sizes.pop()


def slab_slot_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Host bytes of one slot of the memory tier's slab (``tier/worker/slab.py``), of one rank.

    A slot holds one block of any group: layer position ``p`` is as wide as the widest
    ``p``-th layer of any group, rounded up to ``ROW_ALIGN``.
    """
    pages = [
        (int(g.kv_cache_spec.page_size_bytes), len(g.layer_names))
        for g in kv_cache_config.kv_cache_groups
    ]
    positions = max((count for _, count in pages), default=0)
    widths = (
        _round_up(max(page for page, count in pages if count > p), ROW_ALIGN)
        for p in range(positions)
    )
    return max(1, sum(widths))


def _round_up(size: int, align: int) -> int:
    return -(-size // align) * align


def _hf_config_digest(vllm_config: VllmConfig) -> str:
    hf_config = vllm_config.model_config.hf_config
    text = hf_config.to_json_string(use_diff=False) if hasattr(hf_config, "to_json_string") else ""
    return blake3(str(text).encode()).hexdigest(16)


def saves_copy_async() -> bool:
    """Whether the workers' save copies run on a device stream, past the save's return
    (CUDA, see ``tier/worker/slab.py``): their blocks' reuse is then fenced (``tier/fences.py``)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type) == "cuda"


def _kv_cache_layout(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> str:
    """The resolved physical layout (both roles read the same KV cache config first)."""
    layout = getattr(kv_cache_config, "kv_cache_layout", None)
    if layout is None:
        layout = getattr(vllm_config.cache_config, "kv_cache_layout", None)
    return str(layout or "")


def engine_shards(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, tp_rank: int = 0, pp_rank: int = 0
) -> BlockShards:
    """The shards every block is stored in, and which of them the rank holds and writes
    (``kvmux.vllm.entry_layout``)."""
    pp_size = int(vllm_config.parallel_config.pipeline_parallel_size)
    return entry_layout(vllm_config, kv_cache_config).shards(tp_rank, pp_size, pp_rank)


def _layout_keys(layout: EntryLayout, spec: Any) -> dict[str, Any]:
    """What of the entry layout a namespace names: per head, the model's KV heads and
    one head's page bytes (the same at every TP size); per rank, the TP size too."""
    local = int(getattr(spec, "num_kv_heads", 0) or 0)
    page = int(spec.page_size_bytes)
    if layout.name == HEADS:
        return {"num_kv_heads": layout.heads, "head_page_bytes": page // max(1, local)}
    keys: dict[str, Any] = {"num_kv_heads": local, "page_size_bytes": page}
    if layout.name == PER_RANK:
        keys["tensor_parallel_size"] = layout.tp_size
    return keys


def _stage_layers(vllm_config: VllmConfig, names: list[str]) -> dict[str, Any]:
    """What names a group's layers: every layer in one stage; under pipeline parallelism
    (each stage holds its own layers, the scheduler sees stage 0's) the partition."""
    if int(vllm_config.parallel_config.pipeline_parallel_size) == 1:
        return {"layers": list(names)}
    return {"pp_layer_partition": os.environ.get("VLLM_PP_LAYER_PARTITION", "")}


def engine_namespace(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> dict[str, Any]:
    """The namespace mapping that keys and entry headers are bound to.

    It names everything that changes a block's bytes; the tensor-parallel size only where
    entries are per rank (``kvmux.vllm.entry_layout``): per-head entries are the same
    whatever the number of ranks. Each group is described by the spec the scheduler sees
    (``group_spec``), so that every process names the same namespace.
    """
    from vllm.platforms import current_platform

    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    groups = kv_cache_config.kv_cache_groups
    group = groups[0]
    spec = group_spec(group)
    device = str(current_platform.device_type)
    layout = entry_layout(vllm_config, kv_cache_config)
    one_stage = int(parallel.pipeline_parallel_size) == 1
    namespace: dict[str, Any] = {
        "model": str(model.model),
        "revision": str(model.revision),
        "checkpoint": checkpoint_identity(str(model.model), model.revision),
        "quantization": str(getattr(model, "quantization", None)),
        "hf_config": _hf_config_digest(vllm_config),
        "model_dtype": str(model.dtype),
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "kv_spec": type(spec).__name__,
        "kv_dtype": str(getattr(spec, "dtype", "")),
        **_layout_keys(layout, spec),
        "head_size": int(getattr(spec, "head_size", 0)),
        # a stage's own layers are its shard's: the whole model's count under PP
        "num_layers": len(group.layer_names)
        if one_stage
        else int(model.get_total_num_hidden_layers()),
        "block_size": int(spec.block_size),
        "entry_layout": layout.name,
        "pipeline_parallel_size": int(parallel.pipeline_parallel_size),
        "device": device,
        "cpu_isa": torch.backends.cpu.get_cpu_capability() if device == "cpu" else "",
        "kv_cache_layout": _kv_cache_layout(vllm_config, kv_cache_config),
    }
    if int(parallel.pipeline_parallel_size) > 1:
        namespace.update(_stage_layers(vllm_config, []))
    if len(groups) > 1:  # a hybrid model: every group's layers and layout
        namespace["kv_cache_groups"] = [_describe_group(vllm_config, layout, g) for g in groups]
    return namespace


def _describe_group(vllm_config: VllmConfig, layout: EntryLayout, group: Any) -> dict[str, Any]:
    """What of one KV cache group changes the bytes, or the meaning, of its entries."""
    spec = group_spec(group)
    return {
        "kv_spec": type(spec).__name__,
        "kv_dtype": str(getattr(spec, "dtype", "")),
        **_layout_keys(layout, spec),
        "head_size": int(getattr(spec, "head_size", 0)),
        "block_size": int(spec.block_size),
        "sliding_window": int(getattr(spec, "sliding_window", 0) or 0),
        **_stage_layers(vllm_config, list(group.layer_names)),
    }


def prefer_recompute(kv_transfer_config: KVTransferConfig, fail_on_load_error: bool) -> None:
    """A best-effort cache: a failed load is recomputed unless the user asked to fail."""
    if not fail_on_load_error:
        kv_transfer_config.kv_load_failure_policy = "recompute"


def save_queue_sizing(
    vllm_config: VllmConfig, configured: int | None, block_size: int
) -> SaveQueueSizing:
    """What a tier's save queue follows: ``configured`` bytes, or this engine's batch."""
    parallel = vllm_config.parallel_config
    nodes = max(1, int(getattr(parallel, "nnodes", 1) or 1))
    return SaveQueueSizing(
        configured,
        batched_tokens=int(vllm_config.scheduler_config.max_num_batched_tokens or 0),
        block_size=block_size,
        ranks_on_host=max(1, int(parallel.world_size) // nodes),
        host_bytes=host_memory_bytes(),
    )
