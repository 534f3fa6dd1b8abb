"""How many host bytes of saves a tier holds in flight: its save queue (pure Python).

A step's saves are copied out of the KV cache into the save queue's staging slots and
written to the store from there; a save that finds no room is dropped (counted, and one
warning names the setting). The queue is allocated once, so it is also the bound on the
host memory a slow store can make the tier hold.

By default (``"save_queue": "auto"``) it follows the engine: ``SAVE_QUEUE_STEPS`` steps of
``max_num_batched_tokens`` tokens of this rank's KV, so the longest step the scheduler can
plan is saved whole even while the previous one is still being written; at most
``HOST_SHARE`` of the host's memory split among the ranks of the node, and never less than
``FLOOR_BYTES`` (a tiny model's steps) unless the share is smaller. A size set in the
configuration wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "FLOOR_BYTES",
    "HOST_SHARE",
    "SAVE_QUEUE_STEPS",
    "SaveQueueSize",
    "SaveQueueSizing",
    "host_memory_bytes",
]

SAVE_QUEUE_STEPS = 2  # steps of the engine's largest batch the queue holds
HOST_SHARE = 0.125  # of the host's physical memory, at most, per tier, split among its ranks
FLOOR_BYTES = 256 * 2**20  # the least an automatic queue holds (unless the share is less)


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class SaveQueueSize:
    """A save queue's bound in bytes, and what it holds in the engine's terms."""

    bytes: int
    tokens: int  # whole blocks' tokens it holds (0: not known)
    step_tokens: int  # the engine's largest batch, in tokens (0: not known)
    reason: str  # "set in the configuration", "follows the engine", "capped at ..."

    @property
    def steps(self) -> float:
        """How many of the engine's largest steps it holds (0: not known)."""
        return self.tokens / self.step_tokens if self.step_tokens else 0.0

    def describe(self) -> str:
        """One line for the log: ``2.0 steps of 8,192 tokens (16,640 tokens), 4.1 GiB``."""
        size = f"{self.bytes / 2**30:.2f} GiB"
        if not (self.tokens and self.step_tokens):
            return f"{size}, {self.tokens:,} tokens ({self.reason})"
        return (
            f"{self.steps:.1f} steps of {self.step_tokens:,} tokens ({self.tokens:,} tokens), "
            f"{size} ({self.reason})"
        )


@dataclass(frozen=True)
class SaveQueueSizing:
    """What the save queue's size follows: the configured bytes, or the engine's batch."""

    configured: int | None  # bytes set by the operator; None: follow the engine
    batched_tokens: int = 0  # the engine's max_num_batched_tokens (0: not known)
    block_size: int = 0  # tokens per block (0: not known)
    ranks_on_host: int = 1  # this engine's ranks that share the host's memory
    host_bytes: int | None = None  # the host's physical memory (None: not known)

    def size(self, block_bytes: int) -> SaveQueueSize:
        """The bound for a rank whose one block (every group's layers) is ``block_bytes``."""
        block_bytes = max(1, block_bytes)
        if self.configured is not None:
            return self._sized(self.configured, block_bytes, "set in the configuration")
        if not (self.batched_tokens and self.block_size):
            return self._sized(FLOOR_BYTES, block_bytes, "the engine's batch is not known")
        per_step = (-(-self.batched_tokens // self.block_size) + 1) * block_bytes
        wanted = max(SAVE_QUEUE_STEPS * per_step, FLOOR_BYTES)
        cap = self._cap()
        if cap is not None and wanted > cap:
            share = f"{HOST_SHARE:g} of host memory / {self.ranks_on_host} rank(s)"
            return self._sized(cap, block_bytes, f"capped at {share}")
        return self._sized(wanted, block_bytes, "follows the engine")

    def _cap(self) -> int | None:
        if not self.host_bytes:
            return None
        return int(self.host_bytes * HOST_SHARE) // max(1, self.ranks_on_host)

    def _sized(self, nbytes: int, block_bytes: int, reason: str) -> SaveQueueSize:
        tokens = nbytes // block_bytes * self.block_size
        return SaveQueueSize(nbytes, tokens, self.batched_tokens, reason)
