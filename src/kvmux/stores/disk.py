"""Disk store: one file per entry in a directory that several engines may share.

Files are written to a temporary name and renamed into place, so a reader never sees
a torn entry. Entry names are the hex of the key, so no key can escape the directory.
Files are 0600 inside 0700 directories. Recency is the file's mtime, refreshed on
every hit; past the byte budget the oldest files are removed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores.base import KVStore

__all__ = ["DiskStore"]

_SUFFIX = ".kvx"
_EVICT_TO = 0.9  # after an eviction pass the directory holds at most this share of the budget
_RESCAN_SHARE = 0.1  # rescan the shared directory after writing this share of the budget


class DiskStore(KVStore):
    """Directory of entry files within a byte budget."""

    parallel_reads = True

    def __init__(self, path: Path, capacity: int, name: str = "disk"):
        self.name = name
        self.capacity = capacity
        self.root = Path(path)
        self._tmp = self.root / "tmp"
        self._lock = threading.Lock()
        self._prepare_directory()
        self._used = self._scan_used()
        self._unscanned = 0  # bytes this process wrote since it last scanned the directory

    def _prepare_directory(self) -> None:
        try:
            for folder in (self.root, self._tmp):
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(folder, 0o700)
            fd, probe = tempfile.mkstemp(dir=self._tmp)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreUnavailable(
                f"disk store {self.name!r}: cannot create or write {self.root}: {exc}"
            ) from exc

    def _path(self, key: bytes) -> Path:
        name = key.hex()
        return self.root / name[:2] / (name + _SUFFIX)

    def put(self, key: bytes, value: bytes) -> bool:
        """Write ``value`` atomically; evict the oldest files past the budget."""
        if len(value) > self.capacity:
            return False
        target = self._path(key)
        if target.exists():
            return True
        tmp_name = self._write_temp(target, value)
        with self._lock:
            if target.exists():  # another thread or engine wrote it meanwhile
                os.unlink(tmp_name)
                return True
            try:
                os.replace(tmp_name, target)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name)
                raise StoreError(f"disk store {self.name!r}: write failed: {exc}") from exc
            self._used += len(value)
            self._unscanned += len(value)
            due = self._used > self.capacity or self._unscanned > self.capacity * _RESCAN_SHARE
        if due:
            self._evict(keep=target)
        return True

    def _write_temp(self, target: Path, value: bytes) -> str:
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=self._tmp, suffix=".part")
        except OSError as exc:
            raise StoreError(f"disk store {self.name!r}: write failed: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(value)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise StoreError(f"disk store {self.name!r}: write failed: {exc}") from exc
        return tmp_name

    def get(self, key: bytes) -> bytes | None:
        """Read the entry file, refreshing its recency; None when absent."""
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"disk store {self.name!r}: read failed: {exc}") from exc
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def contains(self, key: bytes) -> bool:
        """One stat, no read."""
        return self._path(key).exists()

    def delete(self, key: bytes) -> None:
        """Remove the entry file if present."""
        path = self._path(key)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"disk store {self.name!r}: delete failed: {exc}") from exc
        with self._lock:
            self._used = max(0, self._used - size)

    def used_bytes(self) -> int:
        """Bytes of entry files, as last counted by this process."""
        with self._lock:
            return self._used

    def _entries(self) -> list[tuple[float, int, Path]]:
        found = []
        for path in self.root.glob(f"??/*{_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                found.append((stat.st_mtime, stat.st_size, path))
        return found

    def _scan_used(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _evict(self, keep: Path) -> None:
        """Rescan the directory (other engines write too) and drop the oldest files."""
        with self._lock:
            entries = sorted(self._entries())
            used = sum(size for _, size, _ in entries)
            self._unscanned = 0
            if used > self.capacity:
                budget = int(self.capacity * _EVICT_TO)
                for _, size, path in entries:
                    if used <= budget:
                        break
                    if path == keep:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    used -= size
            self._used = used

    def clear(self) -> None:
        """Remove every entry file."""
        with self._lock:
            for _, _, path in self._entries():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._used = 0
