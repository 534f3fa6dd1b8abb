"""What the scheduler side tells the worker side to do in one engine step."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmux.keys import BlockKey

__all__ = ["BlockTransfer", "RequestLoad", "SavedBlock", "TierStepPlan"]


@dataclass(frozen=True)
class BlockTransfer:
    """One block moving between the engine's KV cache and a store."""

    key: BlockKey  # rank-independent key of the group's share; each worker derives its store key
    block_id: int  # index of the block in the engine's KV cache
    group: int = 0  # KV cache group whose layers the block holds


@dataclass(frozen=True)
class SavedBlock:
    """A block a plan saves, with the request and position it came from (for KV events)."""

    req_id: str  # the request whose block is saved (the first one, if several share it)
    position: int  # block index in the request's tokens
    group: int  # KV cache group
    key: BlockKey


@dataclass(frozen=True)
class RequestLoad:
    """One request's asynchronous load: it runs off the forward path while the request waits.

    The workers read and copy its blocks on loader threads and report the request once,
    when every block is in place or failed (``StoreWorker.finished_loads``).
    """

    req_id: str
    start: int  # position (block index in the prompt) of the first block loaded
    positions: tuple[tuple[BlockTransfer, ...], ...]  # per position from start: each group's block

    @property
    def transfers(self) -> list[BlockTransfer]:
        """Every block of the load, position by position."""
        return [t for position in self.positions for t in position]


@dataclass
class TierStepPlan:
    """Loads to run before the forward pass, saves and evictions after it.

    ``async_loads`` are started this step and run off the forward path; their requests
    are not scheduled until the workers report them finished.

    ``tables`` holds, for every request with saves this step, its block ids up to its last
    planned save, position by position (with several KV cache groups, every group's block
    of a position before the next position's): a block is only worth saving if no block
    before it in its request failed to load this step (the forward pass computed it over
    that block).
    """

    loads: list[BlockTransfer] = field(default_factory=list)
    async_loads: list[RequestLoad] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    evictions: list[BlockKey] = field(default_factory=list)
    tables: dict[str, list[int]] = field(default_factory=dict)  # req id -> its block ids
    idle: bool = False  # no forward pass this step: loads may have the cores to themselves
    step: int = 0  # the scheduler's count of plans, from 1
    # the latest earlier step whose saves hold a block allocated in this one (0: none):
    # the forward pass waits for those copies first (``kvmux.tier.fences``)
    fence: int = 0

    def blocks_computed_over(self, failed: set[int]) -> set[int]:
        """Blocks at or after a failed block in any request's table: not to be saved."""
        tainted: set[int] = set()
        for table in self.tables.values():
            first = next((i for i, block in enumerate(table) if block in failed), None)
            if first is not None:
                tainted.update(table[first:])
        return tainted
