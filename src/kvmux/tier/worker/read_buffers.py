"""Host buffers that entries are read into, lent for one load and taken back.

An entry read into fresh memory pays a page fault for every page it fills, which costs
more than the read itself (glibc's malloc maps every large allocation anew). Buffers
taken back are reused, up to a bound of bytes kept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ReadBuffers"]

KEPT_BYTES = 64 * 2**20  # bytes of buffers kept for reuse (at least one buffer)


class ReadBuffers:
    """Buffers of one size; ``lend`` hands some out and takes them back when done."""

    def __init__(self, size: int, kept_bytes: int = KEPT_BYTES):
        self.size = size
        self._kept = max(1, kept_bytes // max(1, size))  # buffers kept at most
        self._free: list[bytearray] = []  # guarded by _lock
        self._lock = threading.Lock()

    @contextmanager
    def lend(self, count: int) -> Iterator[list[bytearray]]:
        """``count`` buffers, reused where some are free; nothing may use them afterwards."""
        with self._lock:
            reused = self._free[len(self._free) - min(count, len(self._free)) :]
            del self._free[len(self._free) - len(reused) :]
        buffers = reused + [bytearray(self.size) for _ in range(count - len(reused))]
        try:
            yield buffers
        finally:
            with self._lock:
                room = max(0, self._kept - len(self._free))
                self._free.extend(buffers[:room])
