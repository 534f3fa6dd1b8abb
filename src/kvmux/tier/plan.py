"""What the scheduler side tells the worker side to do in one engine step."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmux.keys import BlockKey

__all__ = ["BlockTransfer", "TierStepPlan"]


@dataclass(frozen=True)
class BlockTransfer:
    """One block moving between the engine's KV cache and a store."""

    key: BlockKey  # rank-independent block key; each worker derives its store key
    block_id: int  # index of the block in the engine's KV cache


@dataclass
class TierStepPlan:
    """Loads to run before the forward pass, saves and evictions after it."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    evictions: list[BlockKey] = field(default_factory=list)
