"""Host buffers that loads stage entries in before one copy to the device, reused (torch).

Pinning host memory is slow (a ``cudaHostAlloc`` of 64 MiB takes milliseconds) and its
pages are committed on first use: a buffer per load would pay both on the forward path.
A buffer is lent again once the device has read it (its event has completed; the host
asks, it never waits); while every kept buffer is still being read, a new one is made,
and kept only up to ``KEPT`` buffers.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["KEPT", "StagingBuffers"]

KEPT = 4  # buffers kept for reuse, at most


class StagingBuffers:
    """Host buffers of at least a given size, pinned where ``pin``, lent and given back."""

    def __init__(self, pin: bool, kept: int = KEPT):
        self._pin = pin
        self._kept = kept
        self._free: list[tuple[torch.Tensor, Any]] = []  # (buffer, event of its last read)
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` or more that the device no longer reads."""
        with self._lock:
            for index, (buffer, read) in enumerate(self._free):
                if buffer.numel() >= nbytes and (read is None or read.query()):
                    del self._free[index]
                    return buffer
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin)

    def give_back(self, buffer: torch.Tensor, read: Any) -> None:
        """``buffer`` is free once ``read`` (an event after the copy that reads it) is done."""
        with self._lock:
            if len(self._free) >= self._kept:  # keep the larger buffers
                self._free.sort(key=lambda kept: kept[0].numel())
                if self._free[0][0].numel() >= buffer.numel():
                    return
                del self._free[0]
            self._free.append((buffer, read))

    @property
    def kept_bytes(self) -> int:
        """Bytes of the buffers free for reuse now."""
        with self._lock:
            return sum(buffer.numel() for buffer, _ in self._free)
