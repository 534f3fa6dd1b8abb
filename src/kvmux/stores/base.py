"""The store contract: bytes in, bytes out, under 16-byte keys."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvmux.errors import StoreError

__all__ = ["GENERATION_RECORD_MAX", "KVStore", "StoredEntry", "ValueParts", "value_nbytes"]

GENERATION_RECORD_MAX = 256  # bytes of the longest generation record a store returns
ValueParts = Sequence[memoryview | bytes]  # a value given as the pieces it concatenates


def value_nbytes(parts: ValueParts) -> int:
    """Bytes of the value ``parts`` concatenate."""
    return sum(memoryview(part).nbytes for part in parts)


@dataclass(frozen=True)
class StoredEntry:
    """One entry as a walk finds it, without reading its value."""

    key: bytes
    size: int  # bytes of the value (a split entry: all its parts); 0 if the store cannot tell
    age: float | None  # seconds since it was last written or loaded; None if unknown


class KVStore(ABC):
    """A byte store with a budget. Every method is thread-safe.

    Errors are raised as ``kvmux.errors.StoreError``; callers treat them as misses.
    """

    name: str
    capacity: int
    batched_io = False  # True when the *_many methods cost one round trip, not one per key
    parallel_reads = False  # True when reads block on I/O, so several threads help
    value_limit: int | None = None  # larger values are misses, never read whole (limit_values)

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> bool:
        """Store ``value`` under ``key``; False if it was not stored (too large)."""

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value under ``key``, or None if absent."""

    def get_into(self, key: bytes, buffer: bytearray) -> bytes | memoryview | None:
        """``get``; a store that reads from files may read into ``buffer`` and return a view
        of it (valid until the caller reuses the buffer). A value that does not fit comes as
        bytes of its own."""
        return self.get(key)

    @abstractmethod
    def contains(self, key: bytes) -> bool:
        """Whether ``key`` is present, without reading its value."""

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys``, from the first, are present without a gap."""
        for count, key in enumerate(keys):
            if not self.contains(key):
                return count
        return len(keys)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """``contains`` for each key."""
        return [self.contains(key) for key in keys]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``get`` for each key."""
        return [self.get(key) for key in keys]

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """``put`` for each (key, value)."""
        return [self.put(key, value) for key, value in items]

    def put_many_parts(self, items: Sequence[tuple[bytes, ValueParts]]) -> list[bool]:
        """``put_many`` of values given as their pieces; stores that can, never join them.

        The pieces are views of memory reused once the call returns: a store keeps copies.
        """
        return self.put_many([(key, b"".join(parts)) for key, parts in items])

    def head(self, key: bytes, size: int) -> bytes | None:
        """The first ``size`` bytes of the value (all of a shorter one), or None if absent.

        Operators' reads: unlike ``get``, never refreshes the entry's recency.
        """
        return self.head_many([key], size)[0]

    def head_many(self, keys: Sequence[bytes], size: int) -> list[bytes | None]:
        """``head`` for each key."""
        values = self.get_many(keys)
        return [None if value is None else value[:size] for value in values]

    def walk(self, min_age: float | None = None) -> Iterable[StoredEntry]:
        """Every entry, each once, in no particular order (a sized collection if cheap).

        For operators' tools: entries written or removed meanwhile may or may not appear.
        With ``min_age``, entries known to be younger may be left out, and are then not
        read (entries of unknown age are kept: the caller decides).
        """
        raise StoreError(f"store {self.name!r} cannot list its entries")

    @abstractmethod
    def delete(self, key: bytes) -> None:
        """Remove ``key`` if present."""

    def delete_many(self, keys: Sequence[bytes]) -> None:
        """``delete`` for each key."""
        for key in keys:
            self.delete(key)

    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes currently held (as counted against the capacity)."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    def read_generation(self) -> bytes | None:
        """The tier's generation record as stored (``kvmux.tier.scheduler.generation``), or None.

        At most ``GENERATION_RECORD_MAX + 1`` bytes are read: anything longer is no
        record, and the caller refuses it. This default lives in the process (right for a
        store no other engine sees); shared stores keep it where their entries are.
        """
        return getattr(self, "_generation_record", None)

    def write_generation(self, record: bytes) -> None:
        """Replace the generation record: every engine using the store follows it."""
        self._generation_record: bytes | None = bytes(record)

    def limit_values(self, nbytes: int) -> None:
        """Treat any value larger than ``nbytes`` as absent, and never read one whole.

        The worker sets it to the largest entry it could write (plus a small header), so
        that whoever writes the store cannot make a read take more memory than that.
        """
        self.value_limit = max(0, int(nbytes))

    def close(self) -> None:
        """Release resources; the store is unusable afterwards."""
        return None
