"""One walk over a tier: the entries a command selects, with their headers, verified if asked.

Entries come from the store's ``walk`` (names, sizes, ages: no reads), then in batches
their first bytes (``head_many``) or, to verify, their whole values (``get_many``). The
tools open stores with ``touch=False``, so none of this refreshes an entry's recency
(Redis before 7.2 excepted: see ``kvmux.stores.redis_walk``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass

from kvmux.codec import SigningKeys
from kvmux.errors import ConfigError, StoreError, StoreUnavailable
from kvmux.stores import KVStore
from kvmux.stores.base import StoredEntry
from kvmux.tools.ops.entry import HEAD_BYTES, Header, check, header_end, peek
from kvmux.tools.ops.progress import Progress

__all__ = ["Record", "Scan", "Selection"]

BATCH_ENTRIES = 256  # entries read per batch
BATCH_BYTES = 64 << 20  # bytes of whole entries read per batch (verify)
_MIN_PREFIX = 8  # hex characters of the shortest namespace prefix accepted
Reader = Callable[[Sequence[bytes]], list[bytes | None]]  # get_many or head_many


@dataclass(frozen=True)
class Selection:
    """Which entries a command covers: all, or those of some namespaces and older than an age."""

    namespaces: tuple[str, ...] = ()  # hex ids, or prefixes of at least 8 characters
    older_than: float | None = None  # seconds; entries of unknown age are not selected

    def __post_init__(self) -> None:
        for ns in self.namespaces:
            if len(ns) < _MIN_PREFIX or any(c not in "0123456789abcdef" for c in ns):
                raise ConfigError("--namespace", f"bad namespace id {ns!r}", "8 to 32 hex digits")

    @property
    def everything(self) -> bool:
        """Whether nothing is filtered out."""
        return not self.namespaces and self.older_than is None

    def wants_age(self, entry: StoredEntry) -> bool:
        """Whether the entry is old enough (always, without ``older_than``)."""
        if self.older_than is None:
            return True
        return entry.age is not None and entry.age >= self.older_than

    def wants_header(self, header: Header | None) -> bool:
        """Whether the entry's namespace is selected (an unreadable header never is)."""
        if not self.namespaces:
            return True
        return header is not None and header.namespace.startswith(self.namespaces)


@dataclass(frozen=True)
class Record:
    """One selected entry: what the walk found, its header, and its verification."""

    entry: StoredEntry
    header: Header | None
    status: str | None = None  # None unless verified: "ok", a BAD or UNVERIFIED status
    reason: str = ""


class Scan:
    """Iterate the selected entries of a store once; counts what it passed over."""

    def __init__(
        self,
        store: KVStore,
        selection: Selection,
        progress: Progress,
        verify: bool = False,
        signing: SigningKeys | None = None,
    ):
        self.store = store
        self.selection = selection
        self.progress = progress
        self.verify = verify
        self.signing = signing
        self.unknown_age = 0  # passed over: no age known, and an age was asked for
        self.unreadable = 0  # passed over: a namespace was asked for, the header is unreadable
        self.vanished = 0  # removed (evicted, expired) between the walk and the read

    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def records(self) -> Generator[Record, None, None]:
        """The selected entries, once; closing it early ends the progress line."""
        found = self.store.walk(self.selection.older_than)  # the young are never read
        self.progress.total = len(found) if isinstance(found, Sized) else None
        try:
            for batch in self._batches(found):
                yield from self._records(batch)
        finally:
            self.progress.close()

    def _batches(self, found: Iterable[StoredEntry]) -> Iterator[list[StoredEntry]]:
        batch: list[StoredEntry] = []
        size = 0
        for entry in found:
            if not self.selection.wants_age(entry):
                self.unknown_age += entry.age is None and self.selection.older_than is not None
                self.progress.update(1, entry.size)
                continue
            batch.append(entry)
            size += entry.size
            if len(batch) >= BATCH_ENTRIES or (self.verify and size >= BATCH_BYTES):
                yield batch
                batch, size = [], 0
        if batch:
            yield batch

    def _records(self, batch: list[StoredEntry]) -> Iterator[Record]:
        records = self._verified(batch) if self.verify else self._headed(batch)
        for entry, record in zip(batch, records, strict=True):
            self.progress.update(1, entry.size)
            if record is None:
                self.vanished += 1
            elif self.selection.wants_header(record.header):
                yield record
            else:
                self.unreadable += record.header is None

    def _headed(self, batch: list[StoredEntry]) -> list[Record | None]:
        heads = self._heads([e.key for e in batch], HEAD_BYTES)
        records: list[Record | None] = []
        for entry, (head, error) in zip(batch, heads, strict=True):
            end = header_end(head) if head is not None else None
            if head is not None and end is not None and len(head) < end <= entry.size:
                head, error = self._heads([entry.key], end)[0]  # a header past HEAD_BYTES
            if head is not None:
                records.append(Record(entry, peek(head)))
            elif error or self._present(entry.key):  # not an entry: a wrong type, lost parts
                records.append(Record(entry, None))
            else:
                records.append(None)
        return records

    def _verified(self, batch: list[StoredEntry]) -> list[Record | None]:
        limit = self.store.capacity or None  # a disk tier never reads a larger file
        small = [e.key for e in batch if limit is None or e.size <= limit]
        values = dict(zip(small, self._read(small, self.store.get_many), strict=True))
        records: list[Record | None] = []
        for entry in batch:
            if entry.key in values:
                records.append(self._check(entry, *values[entry.key]))
            else:
                reason = f"{entry.size} bytes, more than the tier's {limit}: never loaded"
                records.append(Record(entry, None, "oversized", reason))
        return records

    def _check(self, entry: StoredEntry, data: bytes | None, error: str) -> Record | None:
        if data is None:
            if not error and not self._present(entry.key):
                return None
            return Record(entry, None, "unreadable", error or "not an entry (wrong type or parts)")
        header = peek(data)
        status, reason = check(data, entry.key, header, self.signing)
        return Record(entry, header, status, reason)

    def _present(self, key: bytes) -> bool:
        try:
            return self.store.contains(key)
        except StoreUnavailable:
            raise
        except StoreError:
            return True

    def _heads(self, keys: list[bytes], size: int) -> list[tuple[bytes | None, str]]:
        return self._read(keys, lambda some: self.store.head_many(some, size))

    def _read(self, keys: list[bytes], read: Reader) -> list[tuple[bytes | None, str]]:
        """(value, error) per key: a batched store reads at once, others key by key."""
        if self.store.batched_io:
            return [(value, "") for value in read(keys)]
        return [_read_one(key, read) for key in keys]


def _read_one(key: bytes, read: Reader) -> tuple[bytes | None, str]:
    """One key's value, or the store's error for it (a store that is down stops the walk)."""
    try:
        return read([key])[0], ""
    except StoreUnavailable:
        raise
    except StoreError as exc:
        return None, str(exc)
