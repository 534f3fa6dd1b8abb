"""Counters of one tier, owned by the connector instance that counts them.

Each StoreConnector (scheduler or worker) holds its own TierStats: the scheduler counts
lookups and offered tokens, the workers count loads and saves. Nothing is shared through
process-wide state, so the figures do not depend on which process runs which half.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

__all__ = ["BLOCK_COUNTERS", "GAUGES", "TierStats"]

GAUGES = frozenset(  # levels: maxed, never summed
    {"stored_bytes", "peak_stored_bytes", "peak_save_queue_bytes"}
)
# counters of whole blocks that every rank of an engine sees alike: under tensor
# parallelism every rank moves its shards of the same blocks and agrees which landed, so
# only the first rank counts them; bytes, seconds and each rank's own failures (a full
# save queue, a failed write) are counted by every rank and summed over ranks
BLOCK_COUNTERS = frozenset({"loaded_blocks", "load_errors", "saved_blocks", "tainted_saves"})


@dataclass
class TierStats:
    """Counters of one tier; all updates go through ``add``."""

    lookups: int = 0  # requests looked up
    unkeyable_requests: int = 0  # requests not cached: an input or the generation unknown
    hit_tokens: int = 0  # tokens offered to the engine
    loaded_blocks: int = 0  # blocks copied into the engine's KV cache
    load_errors: int = 0  # blocks promised but missing or corrupt (recomputed)
    unverified_entries: int = 0  # entries without a valid signature, with signing on (recomputed)
    saved_blocks: int = 0  # blocks written to the store
    save_errors: int = 0  # blocks that could not be written (dropped)
    tainted_saves: int = 0  # blocks not saved: computed over a block that failed to load
    dropped_saves: int = 0  # blocks not saved: the save queue was full (see save_queue)
    store_errors: int = 0  # store calls that raised (lookups included)
    bytes_loaded: int = 0
    bytes_saved: int = 0
    load_seconds: float = 0.0
    save_seconds: float = 0.0
    stored_bytes: int = 0  # bytes the store holds, as of the last write (this process)
    peak_stored_bytes: int = 0  # highest stored_bytes seen
    peak_save_queue_bytes: int = 0  # most host bytes of saves ever waiting for the store
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # False on every rank but the engine's first: its BLOCK_COUNTERS stay 0
    _counts_blocks: bool = field(default=True, repr=False, compare=False)

    def count_blocks(self, counts: bool) -> None:
        """Whether this rank counts whole blocks (``BLOCK_COUNTERS``); one rank does."""
        self._counts_blocks = counts

    def add(self, **deltas: float) -> None:
        """Add each delta to the counter of that name."""
        with self._lock:
            for name, delta in deltas.items():
                if self._counts_blocks or name not in BLOCK_COUNTERS:
                    setattr(self, name, getattr(self, name) + delta)

    def observe_stored(self, stored: int) -> None:
        """Record the store's current size and keep its peak."""
        with self._lock:
            self.stored_bytes = stored
            self.peak_stored_bytes = max(self.peak_stored_bytes, stored)

    def observe_save_queue(self, queued: int) -> None:
        """Record the save queue's current size and keep its peak."""
        with self._lock:
            self.peak_save_queue_bytes = max(self.peak_save_queue_bytes, queued)

    def snapshot(self) -> dict[str, float]:
        """A plain copy of the counters."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name[0] != "_"}
