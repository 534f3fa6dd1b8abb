"""Which layout an engine's entries take: per KV head (any TP size shares them), one
replicated shard (MLA), or one entry per rank (bound to the TP size).

Both the scheduler and every worker decide it from the same inputs (the parallel config
and each KV cache group's first layer spec, which is what vLLM gives the scheduler), so
they agree on the shards a hit needs (``kvmux.tier.shards``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvmux.tier.shards import BlockShards, block_shards

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["HEADS", "PER_RANK", "REPLICATED", "EntryLayout", "entry_layout", "group_spec"]

HEADS = "kv-head-shards-v1"  # one entry per KV head: shared by every TP size
REPLICATED = "replicated-v1"  # MLA's latent, the same on every rank: one entry, from rank 0
PER_RANK = "per-rank-v1"  # each rank's share in one entry: only engines of this TP size


@dataclass(frozen=True)
class EntryLayout:
    """The layout of an engine's entries, and why (for the log)."""

    name: str
    heads: int  # the model's KV heads where entries are per head; else 0
    tp_size: int
    reason: str

    def shards(self, tp_rank: int, pp_size: int, pp_rank: int) -> BlockShards:
        """The shards of a block, and which are this rank's."""
        if self.name == HEADS:
            return block_shards(self.heads, self.tp_size, tp_rank, pp_size, pp_rank)
        if self.name == REPLICATED:
            return block_shards(0, self.tp_size, tp_rank, pp_size, pp_rank, split=False)
        local = (tp_rank,)  # shard stage * TP + rank: each rank its own entry
        return BlockShards(self.tp_size, pp_size, pp_rank, local, False, True)


def group_spec(group: Any) -> Any:
    """A KV cache group's layer spec as the scheduler sees it: the first layer's, for a
    group of layers of different shapes (``UniformTypeKVCacheSpecs``)."""
    spec = group.kv_cache_spec
    inner = getattr(spec, "kv_cache_specs", None)
    return next(iter(inner.values())) if isinstance(inner, dict) and inner else spec


def _per_head_obstacle(vllm_config: VllmConfig, specs: list[Any]) -> str:
    """Why a block's heads cannot be cut into shareable entries here, or ''."""
    parallel = vllm_config.parallel_config
    context = int(getattr(parallel, "decode_context_parallel_size", 1) or 1) * int(
        getattr(parallel, "prefill_context_parallel_size", 1) or 1
    )
    if context > 1:
        return "context parallelism spreads a block's tokens over ranks"
    for spec in specs:
        for name in ("num_head_slots", "state_content_bytes", "page_size_padded"):
            if getattr(spec, name, None) is not None:
                return f"the attention backend lays a page out itself ({name})"
    heads = {int(getattr(spec, "num_kv_heads", 0) or 0) for spec in specs}
    if len(heads) != 1 or min(heads) < 1:
        return f"KV cache groups hold different numbers of KV heads ({sorted(heads)})"
    return ""


def entry_layout(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> EntryLayout:
    """The layout this engine's entries take (the same answer on every rank)."""
    tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
    specs = [group_spec(g) for g in kv_cache_config.kv_cache_groups]
    obstacle = _per_head_obstacle(vllm_config, specs)
    if obstacle:
        return EntryLayout(PER_RANK, 0, tp_size, obstacle)
    if bool(getattr(vllm_config.model_config, "use_mla", False)):
        if all(type(spec).__name__ == "MLAAttentionSpec" for spec in specs):
            return EntryLayout(REPLICATED, 0, tp_size, "MLA: one latent per token on every rank")
        return EntryLayout(PER_RANK, 0, tp_size, "MLA beside other attention layers")
    local = int(specs[0].num_kv_heads)
    model_heads = int(vllm_config.model_config.get_total_num_kv_heads())
    heads = model_heads if local == 1 and model_heads < tp_size else local * tp_size
    return EntryLayout(HEADS, heads, tp_size, "")
