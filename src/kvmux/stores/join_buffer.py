"""Values given as pieces, joined into one buffer kept from call to call.

A store whose client takes a value in one piece (redis-py) must join the pieces a save
writes. A fresh ``bytes`` for each joined value costs its page faults on first touch and
its unmapping when freed: about 1 ms per 2 MiB value on a benchmark machine, more than
the copy itself. The buffer here faults once and is reused.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Sequence

from kvmux.stores.base import ValueParts

__all__ = ["DEFAULT_JOIN_BYTES", "JoinBuffer"]

DEFAULT_JOIN_BYTES = 32 * 2**20  # held by each store that joins, once it first writes

Joined = list[tuple[bytes, bytes | memoryview]]


def _bytes_view(part: memoryview | bytes) -> memoryview:
    view = memoryview(part)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class JoinBuffer:
    """Joins each value's pieces into a buffer of ``size`` bytes reused by the next call."""

    def __init__(self, size: int = DEFAULT_JOIN_BYTES):
        self.size = size
        self._buffer: memoryview | None = None  # allocated at the first join
        self._lock = threading.Lock()

    def batches(self, items: Sequence[tuple[bytes, ValueParts]]) -> Generator[Joined, None, None]:
        """``items`` with their values joined, in order, in batches that fit the buffer.

        A batch's values stay valid until the next batch is taken (or the iteration ends).
        A value larger than the buffer is joined into fresh ``bytes``, as is every value
        while another thread holds the buffer.
        """
        if not self._lock.acquire(blocking=False):
            yield [(key, b"".join(parts)) for key, parts in items]
            return
        try:
            if self._buffer is None:
                self._buffer = memoryview(bytearray(self.size))
            yield from self._fill(self._buffer, items)
        finally:
            self._lock.release()

    def _fill(
        self, buffer: memoryview, items: Sequence[tuple[bytes, ValueParts]]
    ) -> Iterator[Joined]:
        batch: Joined = []
        used = 0
        for key, parts in items:
            views = [_bytes_view(part) for part in parts]
            size = sum(view.nbytes for view in views)
            if size > self.size:
                batch.append((key, b"".join(views)))
                continue
            if used + size > self.size:
                yield batch
                batch, used = [], 0
            start = used
            for view in views:
                buffer[used : used + view.nbytes] = view
                used += view.nbytes
            batch.append((key, buffer[start:used]))
        if batch:
            yield batch
