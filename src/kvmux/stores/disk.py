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

Anyone who can write to the directory can plant anything in it, and cause only misses
(``docs/disk_tier_hostile.md``). Every name under the root is opened relative to a
descriptor of its folder, and neither folder nor file is reached through a symlink (a
shard folder that is one holds no entries and takes no writes). Only a regular file of
at most ``capacity`` bytes (or ``value_limit``, when set) is an entry: a larger one is a
miss, never read. Reads never block (a planted FIFO is a miss), KV goes only into files
this process creates (0600, ``O_EXCL``) or spares it owns (``spare_pool.py``), and every
OS error becomes a StoreError or, for a missing file, a miss. A write that finds the disk
or quota full removes the spares and the oldest entries, then tries once more. Eviction
passes over a shard it cannot list or a file it cannot remove.

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
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores._files import (
    READ_FLAGS,
    create_temp,
    make_private_dir,
    open_dir,
    out_of_space,
    read_at_most,
    read_head,
    read_into,
    remove_file,
    write_all,
)
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
_TEMP_SUFFIX = ".part"
_RECORD_READ = GENERATION_RECORD_MAX + 1  # bytes of the generation file read at most
_ABSENT = (FileNotFoundError, NotADirectoryError)  # no entry file (or no shard folder) there
_HEX = frozenset("0123456789abcdef")


def _key_of(path: Path) -> bytes | None:
    """The key an entry file is named after, or None if no key names it."""
    name = path.name.removesuffix(_SUFFIX)
    if not name or len(name) % 2 or not set(name) <= _HEX or path.parent.name != name[:2]:
        return None
    return bytes.fromhex(name)


def _shard_entries(shard: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of the entry files in one shard; unreadable ones are skipped."""
    found = []
    with contextlib.suppress(OSError), open_dir(shard) as shard_fd, os.scandir(shard_fd) as listing:
        for item in listing:
            if not item.name.endswith(_SUFFIX):
                continue
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((info.st_mtime, info.st_size, shard / item.name))
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
            with contextlib.suppress(FileExistsError):  # never chmod what it did not create
                self.root.mkdir(mode=0o700, parents=True)
                os.chmod(self.root, 0o700)
            for folder in (self._tmp, self._spares.root):
                make_private_dir(folder)
            with open_dir(self._tmp) as tmp_fd:
                fd, probe = create_temp(tmp_fd, ".probe")
                os.close(fd)
                os.unlink(probe, dir_fd=tmp_fd)
        except OSError as exc:
            raise StoreUnavailable(
                f"disk store {self.name!r}: cannot create or write {self.root}: {exc}"
            ) from exc

    def read_generation(self) -> bytes | None:
        """The file ``generation`` (at most ``GENERATION_RECORD_MAX + 1`` bytes), or None:
        absent, or something else than a regular file (a planted folder, FIFO or symlink
        is no record: the engine writes a new one over it)."""
        try:
            info = os.lstat(self.root / _GENERATION)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error("generation", exc) from exc
        if not stat.S_ISREG(info.st_mode):
            return None
        fd = self._open_file(self.root / _GENERATION, "generation", follow_folder=True)
        if fd is None:
            return None
        return self._use_file(
            fd, self.root / _GENERATION, "generation", lambda fd, _: read_head(fd, _RECORD_READ)
        )

    def write_generation(self, record: bytes) -> None:
        """Replace the file ``generation`` atomically; every engine on the directory follows."""
        with self._lock:
            try:
                with open_dir(self._tmp) as tmp_fd, open_dir(self.root, follow=True) as root_fd:
                    tmp_name = self._write_temp(tmp_fd, (record,), len(record))
                    self._clear_planted_folder(root_fd, tmp_fd)
                    self._rename(tmp_fd, tmp_name, root_fd, _GENERATION)
            except OSError as exc:
                raise self._error("generation", exc) from exc

    @staticmethod
    def _clear_planted_folder(root_fd: int, tmp_fd: int) -> None:
        """A folder where the generation file goes cannot be replaced: move it into tmp/."""
        try:
            info = os.lstat(_GENERATION, dir_fd=root_fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            aside = f"planted-{secrets.token_hex(8)}"
            os.rename(_GENERATION, aside, src_dir_fd=root_fd, dst_dir_fd=tmp_fd)

    def _path(self, key: bytes) -> Path:
        name = key.hex()
        return self.root / name[:2] / (name + _SUFFIX)

    def _error(self, what: str, exc: OSError | str) -> StoreError:
        return StoreError(f"disk store {self.name!r}: {what} failed: {exc}")

    def _largest(self) -> int:
        """Bytes of the largest file that can be an entry: the budget, or the value limit."""
        limit = self.value_limit
        return self.capacity if limit is None else min(self.capacity, limit)

    def _is_entry(self, dir_fd: int, name: str) -> bool:
        """Whether ``name`` in the folder ``dir_fd`` is a regular file that can be an entry."""
        try:
            info = os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_size <= self._largest()

    def _holds(self, path: Path, what: str) -> bool:
        """Whether ``path`` is an entry (a shard folder that is a symlink holds none)."""
        try:
            with open_dir(path.parent) as shard_fd:
                return self._is_entry(shard_fd, path.name)
        except _ABSENT:
            return False
        except OSError as exc:
            raise self._error(what, exc) from exc

    def put(self, key: bytes, value: bytes) -> bool:
        """Write ``value`` atomically; evict the oldest files past the budget."""
        return self._put(key, (value,))

    def put_many_parts(self, items: Sequence[tuple[bytes, ValueParts]]) -> list[bool]:
        """Write each value from its pieces (one writev), never joining them in memory."""
        return [self._put(key, parts) for key, parts in items]

    def _put(self, key: bytes, parts: ValueParts) -> bool:
        size = value_nbytes(parts)
        if size > self._largest():
            return False
        target = self._path(key)
        if self._holds(target, "write"):
            return True
        try:
            installed = self._write(target, parts, size)
        except StoreError as exc:
            if not out_of_space(exc):
                raise
            self._free_space(size)  # the disk or the quota is full: make room, once more
            installed = self._write(target, parts, size)
        if not installed:
            return True
        with self._lock:
            over = self._used + self._spares.nbytes > self.capacity
            due = over or self._unscanned > self.capacity * _RESCAN_SHARE
        if due:
            self._evict(keep=target)
        return True

    def _write(self, target: Path, parts: ValueParts, size: int) -> bool:
        """Write ``parts`` to a temporary file and rename it to ``target``, counting it.

        False if an entry was there already. The shard folder is created if missing and
        refused if it is a symlink or no directory: nothing is written outside the root.
        """
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(target.parent, 0o700)
            with open_dir(target.parent) as shard_fd, open_dir(self._tmp) as tmp_fd:
                tmp_name = self._write_temp(tmp_fd, parts, size)
                with self._lock:
                    if not self._install(tmp_fd, tmp_name, shard_fd, target.name):
                        return False
                    self._used += size
                    self._unscanned += size
                    return True
        except OSError as exc:
            raise self._error("write", exc) from exc

    def _write_temp(self, tmp_fd: int, parts: ValueParts, size: int) -> str:
        """Write ``parts`` (``size`` bytes) to a new temporary file in ``tmp_fd``; its name."""
        if self._direct is not None and size >= DIRECT_MIN_BYTES:
            tmp_name = f"{secrets.token_hex(8)}{_TEMP_SUFFIX}"
            try:
                self._direct.write_new(tmp_name, parts, dir_fd=tmp_fd)
                return tmp_name
            except DirectRefused as exc:  # this file system: through the page cache from now on
                self._direct = None
                log.info(
                    "kvmux disk %s: %s refuses O_DIRECT (%s); writing through the page cache",
                    self.name,
                    self.root,
                    exc.strerror,
                )
        return self._write_buffered(tmp_fd, parts, size)

    def _write_buffered(self, tmp_fd: int, parts: ValueParts, size: int) -> str:
        """Write ``parts`` to a temporary file through the page cache; its name.

        The file is a spare overwritten in place when the pool has one fit for it (this
        process's own, 0600), else a new file.
        """
        fd, tmp_name = self._spares.claim(tmp_fd, _TEMP_SUFFIX) or create_temp(tmp_fd, _TEMP_SUFFIX)
        try:
            try:
                write_all(fd, parts)
                os.ftruncate(fd, size)  # a spare may have been longer
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=tmp_fd)
            raise
        return tmp_name

    def _install(self, tmp_fd: int, tmp_name: str, shard_fd: int, name: str) -> bool:
        """Rename the temp file to ``name`` in the shard; False if an entry is there already."""
        if self._is_entry(shard_fd, name):  # another thread or engine wrote it meanwhile
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=tmp_fd)
            return False
        self._rename(tmp_fd, tmp_name, shard_fd, name)  # also replaces a planted non-entry
        return True

    @staticmethod
    def _rename(tmp_fd: int, tmp_name: str, dir_fd: int, name: str) -> None:
        """Move the temp file to ``name`` in the folder ``dir_fd``; else remove it and raise."""
        try:
            os.replace(tmp_name, name, src_dir_fd=tmp_fd, dst_dir_fd=dir_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=tmp_fd)
            raise

    def _free_space(self, need: int) -> None:
        """Make room after the disk or quota ran out: free ``need`` bytes at least.

        The spares go first, then the oldest entries; best effort (the write tried again
        tells whether it was enough).
        """
        with self._lock:
            freed = self._spares.nbytes
            self._spares.clear()
            try:
                entries = sorted(self._entries())
            except StoreError:
                return
            for _, size, path in entries:
                if freed >= need:
                    break
                if remove_file(path) is None:
                    freed += size
                    self._used = max(0, self._used - size)

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
        if info.st_size >= len(buffer):
            return self._read(fd, info)  # a byte to spare in the buffer tells what grew
        view = memoryview(buffer)[: info.st_size + 1]
        filled = read_into(fd, view)
        if filled > info.st_size:
            return None  # it grew meanwhile
        self._touch(fd)
        return view[:filled]

    def _read(self, fd: int, info: os.stat_result) -> bytes | None:
        data = read_at_most(fd, info.st_size)
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
        return [
            self._open_entry(key, lambda fd, info: read_head(fd, min(size, info.st_size)))
            for key in keys
        ]

    def _open_entry(self, key: bytes, read: Callable[[int, os.stat_result], R]) -> R | None:
        """``read(fd, stat)`` of the key's entry file; None when absent or oversized.

        Never follows a symlink (nor a shard folder that is one), opens anything but a
        regular file, nor reads one larger than an entry can be; an OSError is a StoreError.
        """
        path = self._path(key)
        fd = self._open_file(path, "read")
        if fd is None:
            return None
        return self._use_file(fd, path, "read", partial(self._bounded, read))

    def _bounded(
        self, read: Callable[[int, os.stat_result], R], fd: int, info: os.stat_result
    ) -> R | None:
        """``read(fd, info)``, or None for a file larger than an entry can be (never read)."""
        return None if info.st_size > self._largest() else read(fd, info)

    def _open_file(self, path: Path, what: str, follow_folder: bool = False) -> int | None:
        """An fd to read ``path``, or None if absent.

        Opened in its folder, following a symlink in neither (but for the folder if
        ``follow_folder``: the root, which the operator names).
        """
        try:
            with open_dir(path.parent, follow=follow_folder) as dir_fd:
                return os.open(path.name, READ_FLAGS, dir_fd=dir_fd)
        except _ABSENT:
            return None
        except OSError as exc:
            raise self._error(what, exc) from exc

    def _use_file(
        self, fd: int, path: Path, what: str, use: Callable[[int, os.stat_result], R]
    ) -> R:
        """``use(fd, stat)`` if ``fd`` is a regular file (else a StoreError), then close it."""
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise self._error(what, f"{path} is not a regular file")
            return use(fd, info)
        except OSError as exc:
            raise self._error(what, exc) from exc
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
        """One stat in the shard folder, no read."""
        return self._holds(self._path(key), "lookup")

    def delete(self, key: bytes) -> None:
        """Remove the entry file if present."""
        path = self._path(key)
        try:
            with open_dir(path.parent) as shard_fd:
                info = os.lstat(path.name, dir_fd=shard_fd)
                os.unlink(path.name, dir_fd=shard_fd)
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
                    self.root / item.name
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
            largest = self._largest()
            # files no engine of this tier could have written (a planted huge or sparse
            # one) go first, so they never cost the entries their room
            entries = sorted(self._entries(), key=lambda e: (e[1] <= largest, e[0]))
            used = sum(size for _, size, _ in entries)
            self._unscanned = 0
            if used + self._spares.scan() > self.capacity:  # entries and spares share it
                budget = int(self.capacity * _EVICT_TO)
                for _, size, path in entries:
                    if used <= budget:
                        break
                    if path == keep:
                        continue
                    if size > largest:  # no spare either: removed
                        removed = remove_file(path) is None
                    else:
                        removed = self._retire(path, size)
                    if removed:
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
