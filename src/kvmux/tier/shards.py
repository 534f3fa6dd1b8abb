"""How a block is cut into stored shards, so that engines of any tensor-parallel size share them.

A block of one KV cache group is stored as one entry per **shard**: a shard is one KV head
of one pipeline stage's layers (``heads`` shards per stage), or the whole stage's share
where heads are not split (MLA's one latent per token, replicated on every rank). The
shard index is ``stage * heads + head``; ``kvmux.keys.store_key(key, shard)`` names it.

A rank holds the heads the engine gives it: with tensor-parallel size ``T`` and ``H`` KV
heads, rank ``r`` holds heads ``[r*H/T, (r+1)*H/T)`` when ``T <= H``; when ``T > H``
each head is replicated on ``T/H`` ranks, rank ``r`` holds head ``r // (T/H)``, and only
the first rank of each replica set writes it. So every engine of the same model and
pipeline layout, whatever its TP size, stores and reads the same shards: an engine reads
exactly its heads' bytes, and writes each shard from one rank.

Pure bookkeeping, no torch: the scheduler side counts shards, the worker side cuts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmux.errors import ConfigError

__all__ = ["BlockShards", "block_shards"]


@dataclass(frozen=True)
class BlockShards:
    """The shards of every block, and which of them this rank holds and writes."""

    heads: int = 1  # shards per pipeline stage: the model's KV heads (1: heads not split)
    stages: int = 1  # pipeline-parallel stages, each holding its own layers
    stage: int = 0  # this rank's stage
    local: tuple[int, ...] = (0,)  # the head index of each head position in this rank's cache
    split: bool = False  # whether this rank's KV tensors are cut along their head axis
    writes: bool = True  # whether this rank writes its shards (one writer per shard)

    @property
    def per_block(self) -> int:
        """How many shards a block has in all: a hit needs every one."""
        return self.heads * self.stages

    def shard(self, position: int) -> int:
        """The shard index of this rank's head ``position`` (0 where heads are not split)."""
        return self.stage * self.heads + self.local[position]


def block_shards(
    total_heads: int,
    tp_size: int = 1,
    tp_rank: int = 0,
    pp_size: int = 1,
    pp_rank: int = 0,
    split: bool = True,
) -> BlockShards:
    """The shards of a rank of an engine with ``total_heads`` KV heads (``split=False``: a
    layout without heads to cut, e.g. MLA's latent, the same on every rank)."""
    if tp_size < 1 or not 0 <= tp_rank < tp_size or pp_size < 1 or not 0 <= pp_rank < pp_size:
        raise ConfigError(
            "tensor_parallel_size",
            f"rank {tp_rank} of {tp_size}, stage {pp_rank} of {pp_size} is not a rank",
        )
    if not split or total_heads < 1:  # one shard per stage, the same bytes on every rank
        return BlockShards(1, pp_size, pp_rank, (0,), False, tp_rank == 0)
    if tp_size <= total_heads:
        if total_heads % tp_size:
            raise ConfigError(
                "tensor_parallel_size",
                f"{total_heads} KV heads do not split over {tp_size} ranks",
                "a size that divides the KV heads",
            )
        count = total_heads // tp_size
        local = tuple(range(tp_rank * count, (tp_rank + 1) * count))
        return BlockShards(total_heads, pp_size, pp_rank, local, True, True)
    if tp_size % total_heads:
        raise ConfigError(
            "tensor_parallel_size",
            f"{total_heads} KV heads do not replicate evenly over {tp_size} ranks",
            "a multiple of the KV heads",
        )
    replicas = tp_size // total_heads
    head = tp_rank // replicas
    return BlockShards(total_heads, pp_size, pp_rank, (head,), True, tp_rank % replicas == 0)
