"""Disk store: one file per entry in a directory that several engines may share.

Files are written to a temporary name and renamed into place, so a reader never sees
a torn entry. Entry names are the hex of the key, so no key can escape the directory.
Files are 0600; directories the store creates are 0700 (a directory that already exists
keeps its owner's mode). Recency is the file's mtime, refreshed on every hit (not by
``head`` nor, with ``touch=False``, by operators' reads); past the byte budget the oldest
files are evicted: moved to the spare pool (``spare_pool.py``), whose files later writes
overwrite in place so that a full tier keeps its page cache instead of churning it, or
removed once the pool is full. The file ``generation`` holds the directory's
generation, which a reset advances for every engine sharing it.

Anyone who can write to the directory can plant anything in it: only a regular file of
at most ``capacity`` bytes is an entry (anything larger is a miss, never read), symlinks
are not followed, and every OS error becomes a StoreError or, for a missing file, a miss.
Eviction passes over a shard it cannot list or a file it cannot remove.

With ``direct_writes``, entries are written around the page cache (``O_DIRECT``, see
``direct_io.py``) unless the file system refuses it; reads go through the page cache.
Such a store removes the files it evicts: it has no use for spares.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores._files import remove_file
from kvmux.stores.base import GENERATION_RECORD_MAX, KVStore, StoredEntry, ValueParts, value_nbytes
from kvmux.stores.direct_io import DIRECT_MIN_BYTES, O_DIRECT, DirectRefused, DirectWriter
from kvmux.stores.spare_pool import SparePool

__all__ = ["DiskStore"]

log = logging.getLogger(__name__)
R = TypeVar("R")

_SUFFIX = ".kvx"
_GENERATION = "generation"  # file holding the directory's generation (see KVStore)
_EVICT_TO = 0.9  # after an eviction pass the directory holds at most this share of the budget
_RESCAN_SHARE = 0.1  # rescan the shared directory after writing this share of the budget
# non-blocking so that a planted FIFO cannot hang a read; never through a planted symlink
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_ABSENT = (FileNotFoundError, NotADirectoryError)  # no entry file at this path
_HEX = frozenset("0123456789abcdef")
_IOV_MAX = 1024  # buffers per writev (POSIX guarantees at least 16; Linux takes 1024)


def _write_all(fd: int, parts: ValueParts) -> None:
    """Write ``parts`` in order, whole, with as few system calls as the OS allows."""
    views = [view for view in (memoryview(part).cast("B") for part in parts) if view.nbytes]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        if written <= 0:
            raise OSError(f"writev wrote {written} bytes")
        while views and written >= views[0].nbytes:
            written -= views.pop(0).nbytes
        if written:
            views[0] = views[0][written:]


def _read_head(fd: int, size: int) -> bytes:
    """The file's first ``size`` bytes (all of a shorter file)."""
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_at_most(fd: int, size: int) -> bytes | None:
    """The file's bytes, or None if it holds more than ``size`` (it grew meanwhile)."""
    data = _read_head(fd, size + 1)
    return data if len(data) <= size else None


def _read_into(fd: int, view: memoryview) -> int:
    """Fill ``view`` from the file (less at its end); the bytes read."""
    filled = 0
    while filled < view.nbytes:
        count = os.readv(fd, [view[filled:]])
        if count <= 0:
            break
        filled += count
    return filled


def _key_of(path: Path) -> bytes | None:
    """The key an entry file is named after, or None if no key names it."""
    name = path.name.removesuffix(_SUFFIX)
    if not name or len(name) % 2 or not set(name) <= _HEX or path.parent.name != name[:2]:
        return None
    return bytes.fromhex(name)


def _shard_entries(shard: str) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of the entry files in one shard; unreadable ones are skipped."""
    found = []
    with contextlib.suppress(OSError), os.scandir(shard) as listing:
        for item in listing:
            if not item.name.endswith(_SUFFIX):
                continue
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((info.st_mtime, info.st_size, Path(item.path)))
    return found


class DiskStore(KVStore):
    """Directory of entry files within a byte budget."""

    parallel_reads = True

    def __init__(
        self,
        path: Path,
        capacity: int,
        name: str = "disk",
        touch: bool = True,
        direct_writes: bool = False,
    ):
        self.name = name
        self.capacity = capacity
        self.touch = touch  # False: reads leave mtimes (recency) alone, as operators' tools need
        # entries written around the page cache (direct_io.py); None: through it
        self._direct = DirectWriter() if direct_writes and O_DIRECT else None
        self.root = Path(path)
        self._tmp = self.root / "tmp"
        # the spare pool holds what an eviction pass frees: entries and spares fit the budget
        spare_budget = capacity - int(capacity * _EVICT_TO)
        self._spares = SparePool(self.root / "spare", spare_budget, capacity)
        self._lock = threading.Lock()
        self._prepare_directory()
        self._spares.scan()
        try:
            self._used = self._scan_used()
        except StoreError as exc:
            raise StoreUnavailable(str(exc)) from exc
        self._unscanned = 0  # bytes this process wrote since it last scanned the directory

    @property
    def writes_directly(self) -> bool:
        """Whether large entries are written around the page cache (``O_DIRECT``)."""
        return self._direct is not None

    def _prepare_directory(self) -> None:
        try:
            for folder in (self.root, self._tmp, self._spares.root):
                with contextlib.suppress(FileExistsError):  # never chmod what it did not create
                    folder.mkdir(mode=0o700, parents=True)
                    os.chmod(folder, 0o700)
            fd, probe = tempfile.mkstemp(dir=self._tmp)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreUnavailable(
                f"disk store {self.name!r}: cannot create or write {self.root}: {exc}"
            ) from exc

    def read_generation(self) -> bytes | None:
        """The file ``generation`` (at most ``GENERATION_RECORD_MAX + 1`` bytes), or None."""
        try:
            fd = os.open(self.root / _GENERATION, _READ_FLAGS)
        except _ABSENT:
            return None
        except OSError as exc:
            raise self._error("generation", exc) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise self._error("generation", f"{self.root / _GENERATION} is not a file")
            return _read_head(fd, GENERATION_RECORD_MAX + 1)
        except OSError as exc:
            raise self._error("generation", exc) from exc
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def write_generation(self, record: bytes) -> None:
        """Replace the file ``generation`` atomically; every engine on the directory follows."""
        with self._lock:
            tmp_name = self._write_temp(self.root / _GENERATION, (record,), len(record))
            try:
                os.replace(tmp_name, self.root / _GENERATION)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
                raise self._error("generation", exc) from exc

    def _path(self, key: bytes) -> Path:
        name = key.hex()
        return self.root / name[:2] / (name + _SUFFIX)

    def _error(self, what: str, exc: OSError | str) -> StoreError:
        return StoreError(f"disk store {self.name!r}: {what} failed: {exc}")

    def _holds(self, path: Path, what: str) -> bool:
        """Whether ``path`` is an entry: a regular file of at most ``capacity`` bytes."""
        try:
            info = os.lstat(path)
        except _ABSENT:
            return False
        except OSError as exc:
            raise self._error(what, exc) from exc
        return stat.S_ISREG(info.st_mode) and info.st_size <= self.capacity

    def put(self, key: bytes, value: bytes) -> bool:
        """Write ``value`` atomically; evict the oldest files past the budget."""
        return self._put(key, (value,))

    def put_many_parts(self, items: Sequence[tuple[bytes, ValueParts]]) -> list[bool]:
        """Write each value from its pieces (one writev), never joining them in memory."""
        return [self._put(key, parts) for key, parts in items]

    def _put(self, key: bytes, parts: ValueParts) -> bool:
        size = value_nbytes(parts)
        if size > self.capacity:
            return False
        target = self._path(key)
        if self._holds(target, "write"):
            return True
        tmp_name = self._write_temp(target, parts, size)
        with self._lock:
            if not self._install(tmp_name, target):
                return True
            self._used += size
            self._unscanned += size
            over = self._used + self._spares.nbytes > self.capacity
            due = over or self._unscanned > self.capacity * _RESCAN_SHARE
        if due:
            self._evict(keep=target)
        return True

    def _write_temp(self, target: Path, parts: ValueParts, size: int) -> str:
        """Write ``parts`` (``size`` bytes) to a new temporary file beside ``target``; its name."""
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise self._error("write", exc) from exc
        if self._direct is not None and size >= DIRECT_MIN_BYTES:
            tmp_name = str(self._tmp / f"{secrets.token_hex(8)}.part")
            try:
                self._direct.write_new(tmp_name, parts)
                return tmp_name
            except DirectRefused as exc:  # this file system: through the page cache from now on
                self._direct = None
                log.info(
                    "kvmux disk %s: %s refuses O_DIRECT (%s); writing through the page cache",
                    self.name,
                    self.root,
                    exc.strerror,
                )
            except OSError as exc:
                raise self._error("write", exc) from exc
        return self._write_buffered(parts, size)

    def _write_buffered(self, parts: ValueParts, size: int) -> str:
        """Write ``parts`` to a temporary file through the page cache; its name.

        The file is a spare overwritten in place when the pool has one, else a new file.
        """
        claimed = self._spares.claim(self._tmp, ".part")
        try:
            fd, tmp_name = claimed or tempfile.mkstemp(dir=self._tmp, suffix=".part")
        except OSError as exc:
            raise self._error("write", exc) from exc
        try:
            try:
                _write_all(fd, parts)
                os.ftruncate(fd, size)  # a spare may have been longer
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise self._error("write", exc) from exc
        return tmp_name

    def _install(self, tmp_name: str, target: Path) -> bool:
        """Rename the temp file to ``target``; False if an entry is there already."""
        installed = False
        try:
            if self._holds(target, "write"):  # another thread or engine wrote it meanwhile
                return False
            os.replace(tmp_name, target)  # also replaces a planted file that is no entry
            installed = True
        except OSError as exc:
            raise self._error("write", exc) from exc
        finally:
            if not installed:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
        return True

    def get(self, key: bytes) -> bytes | None:
        """Read the entry file, refreshing its recency; None when absent or oversized."""
        return self._open_entry(key, self._read)

    def get_into(self, key: bytes, buffer: bytearray) -> bytes | memoryview | None:
        """``get``, read into ``buffer`` when the entry fits in it: then a view of it.

        Reads into memory that is reused spare the page faults of fresh memory, which cost
        more than the read itself (glibc's malloc maps every large read anew).
        """
        return self._open_entry(key, partial(self._read_into_buffer, buffer))

    def _read_into_buffer(
        self, buffer: bytearray, fd: int, info: os.stat_result
    ) -> bytes | memoryview | None:
        if info.st_size > self.capacity or info.st_size >= len(buffer):
            return self._read(fd, info)  # a byte to spare in the buffer tells what grew
        view = memoryview(buffer)[: info.st_size + 1]
        filled = _read_into(fd, view)
        if filled > info.st_size:
            return None  # it grew meanwhile
        self._touch(fd)
        return view[:filled]

    def _read(self, fd: int, info: os.stat_result) -> bytes | None:
        if info.st_size > self.capacity:
            return None  # no entry is larger than the budget: garbage, never read
        data = _read_at_most(fd, info.st_size)
        if data is not None:
            self._touch(fd)
        return data

    def _touch(self, fd: int) -> None:
        """Refresh a read entry's recency (its mtime), unless the store leaves it alone."""
        if self.touch:
            with contextlib.suppress(OSError):
                os.utime(fd)

    def head_many(self, keys: Sequence[bytes], size: int) -> list[bytes | None]:
        """The first ``size`` bytes of each entry file, leaving its mtime alone."""
        return [self._open_entry(key, lambda fd, _: _read_head(fd, size)) for key in keys]

    def _open_entry(self, key: bytes, read: Callable[[int, os.stat_result], R]) -> R | None:
        """``read(fd, stat)`` of the key's entry file; None when absent.

        Never follows a symlink nor opens anything but a regular file; an OSError is a
        StoreError.
        """
        path = self._path(key)
        try:
            fd = os.open(path, _READ_FLAGS)
        except _ABSENT:
            return None
        except OSError as exc:
            raise self._error("read", exc) from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise self._error("read", f"{path} is not a regular file")
            return read(fd, info)
        except OSError as exc:
            raise self._error("read", exc) from exc
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def walk(self, min_age: float | None = None) -> list[StoredEntry]:
        """Every entry file named after a key (at least ``min_age`` old), by name.

        An entry's age is that of its mtime.
        """
        now, found = time.time(), []
        for mtime, size, path in sorted(self._entries(), key=lambda entry: entry[2]):
            key, age = _key_of(path), max(0.0, now - mtime)
            if key is not None and (min_age is None or age >= min_age):
                found.append(StoredEntry(key, size, age))
        return found

    def contains(self, key: bytes) -> bool:
        """One stat, no read."""
        return self._holds(self._path(key), "lookup")

    def delete(self, key: bytes) -> None:
        """Remove the entry file if present."""
        path = self._path(key)
        try:
            info = os.lstat(path)
            path.unlink()
        except _ABSENT:
            return
        except OSError as exc:
            raise self._error("delete", exc) from exc
        if stat.S_ISREG(info.st_mode):
            with self._lock:
                self._used = max(0, self._used - info.st_size)

    def used_bytes(self) -> int:
        """Bytes of entry files, as last counted by this process."""
        with self._lock:
            return self._used

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every entry file; raises StoreError if the root is unreadable."""
        try:
            with os.scandir(self.root) as listing:
                shards = [
                    item.path
                    for item in listing
                    if len(item.name) == 2 and item.is_dir(follow_symlinks=False)
                ]
        except OSError as exc:
            raise self._error("scan", exc) from exc
        return [entry for shard in shards for entry in _shard_entries(shard)]

    def _scan_used(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _evict(self, keep: Path) -> None:
        """Rescan the directory (other engines write too) and drop the oldest files."""
        with self._lock:
            entries = sorted(self._entries())
            used = sum(size for _, size, _ in entries)
            self._unscanned = 0
            if used + self._spares.scan() > self.capacity:  # entries and spares share it
                budget = int(self.capacity * _EVICT_TO)
                for _, size, path in entries:
                    if used <= budget:
                        break
                    if path != keep and self._retire(path, size):
                        used -= size
            self._used = used

    def _retire(self, path: Path, size: int) -> bool:
        """Evict one entry file: into the spare pool when writing through the page cache."""
        if self._direct is None:
            return self._spares.retire(path, size)
        return remove_file(path) is None

    def clear(self) -> None:
        """Remove every entry and spare file; raises StoreError if some could not be removed."""
        with self._lock:
            left = [(size, remove_file(path)) for _, size, path in self._entries()]
            failed = [(size, error) for size, error in left if error is not None]
            self._used = sum(size for size, _ in failed)
            spare_error = self._spares.clear()
        if failed:
            raise self._error("clear", failed[0][1]) from failed[0][1]
        if spare_error is not None:
            raise self._error("clear", spare_error) from spare_error
