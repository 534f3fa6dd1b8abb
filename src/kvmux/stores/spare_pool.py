"""Evicted entry files kept for reuse, so a full disk tier stops churning the page cache.

A disk tier at its budget evicts an old file for every new one. Removing a file frees its
page-cache pages and a new file takes fresh ones: the writing thread pays for every page
it allocates, and on a virtual machine that hands free memory back to its host each such
page costs a fault on the host too. So the disk store moves an evicted file here instead
of removing it, and a later write claims it (a rename, atomic, so engines sharing the
directory never claim the same file) and overwrites it in place: the file's pages stay
cached and are reused, never freed.

A reader that opened an entry before it was evicted may read the new entry's bytes
meanwhile. Every entry names its key in its checksummed header (``codec.py``), so the
reader sees a mismatch: a miss, never another key's KV.

The pool holds at most ``budget`` bytes; an evicted file beyond that is removed. Anyone
who can write to the directory can plant files here too: only a regular file with one
link, of at most ``max_size`` bytes, is reused: another regular file is removed when
claimed, and anything that is not a regular file is never claimed nor counted.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading
from pathlib import Path

from kvmux.stores._files import remove_file

__all__ = ["SparePool"]

_SUFFIX = ".spare"
_OPEN_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class SparePool:
    """A directory of evicted entry files, claimed one at a time for reuse."""

    def __init__(self, root: Path, budget: int, max_size: int):
        self.root = root
        self.budget = budget
        self.max_size = max_size  # a larger file is never reused
        self._lock = threading.Lock()
        self._known: list[tuple[str, int]] = []  # (name, size) this process may claim
        self._nbytes = 0  # bytes in the pool, as last counted by this process

    @property
    def nbytes(self) -> int:
        """Bytes of spare files, as last counted by this process."""
        with self._lock:
            return self._nbytes

    def scan(self) -> int:
        """Relist the pool (other engines retire and claim too); its bytes."""
        found = []
        with contextlib.suppress(OSError), os.scandir(self.root) as listing:
            for item in listing:
                if not item.name.endswith(_SUFFIX):
                    continue
                with contextlib.suppress(OSError):
                    info = item.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):  # anything else planted is left alone
                        found.append((item.name, info.st_size))
        with self._lock:
            self._known = found
            self._nbytes = sum(size for _, size in found)
            return self._nbytes

    def retire(self, path: Path, size: int) -> bool:
        """Move the evicted file ``path`` into the pool, or remove it if the pool is full.

        True when the file is gone from ``path``; False if it could not be moved nor removed.
        """
        with self._lock:
            room = self._nbytes + size <= self.budget and size <= self.max_size
            if room:
                self._nbytes += size  # reserved before the rename, released if it fails
        if room:
            name = secrets.token_hex(8) + _SUFFIX
            try:
                os.replace(path, self.root / name)
            except FileNotFoundError:
                self._release(size)
                return True  # another engine evicted it first
            except OSError:
                self._release(size)
            else:
                with self._lock:
                    self._known.append((name, size))
                return True
        return remove_file(path) is None

    def claim(self, directory: Path, suffix: str) -> tuple[int, str] | None:
        """Rename a spare file to a new name in ``directory`` (ending in ``suffix``) and
        open it for writing in place; (its fd, its path), or None if there is none.

        The caller writes from offset 0 and cuts the file to its new length.
        """
        while True:
            with self._lock:
                if not self._known:
                    return None
                name, size = self._known.pop()
            dest = str(directory / f"{secrets.token_hex(8)}{suffix}")
            try:
                os.rename(self.root / name, dest)
            except OSError:
                continue  # claimed by another engine, or gone
            self._release(size)
            fd = self._open_reusable(dest)
            if fd is not None:
                return fd, dest

    def _open_reusable(self, path: str) -> int | None:
        """An fd to write ``path`` in place if it is a file fit for reuse; else remove it."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            fd = None
        if fd is not None:
            try:
                info = os.fstat(fd)
                fit = info.st_nlink == 1 and info.st_size <= self.max_size
                if stat.S_ISREG(info.st_mode) and fit:
                    os.set_blocking(fd, True)
                    return fd
            except OSError:
                pass
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None

    def _release(self, size: int) -> None:
        with self._lock:
            self._nbytes = max(0, self._nbytes - size)

    def clear(self) -> OSError | None:
        """Remove every spare file; the first error met, if any."""
        first: OSError | None = None
        names: list[str] = []
        with contextlib.suppress(OSError), os.scandir(self.root) as listing:
            names = [item.name for item in listing if item.name.endswith(_SUFFIX)]
        for name in names:
            error = remove_file(self.root / name)  # every file, whatever failed before
            first = first or error
        self.scan()
        return first
