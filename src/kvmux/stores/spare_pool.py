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
who can write to the directory can plant files here too: a claimed file is reused only
if it is a regular file this process's user owns, with one link, of at most ``max_size``
bytes (``_files.fit_to_overwrite``, checked on the open descriptor, which then makes it
0600); any other claimed file is removed unwritten, and anything that is not a regular
file is never claimed nor counted. Every name is reached through a descriptor of the
pool's folder or the caller's, never through a symlink.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading
from pathlib import Path

from kvmux.stores._files import fit_to_overwrite, open_dir, remove_file

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
        with (
            contextlib.suppress(OSError),
            open_dir(self.root) as pool_fd,
            os.scandir(pool_fd) as listing,
        ):
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
                moved = self._move_in(path, name)
            except OSError:
                self._release(size)  # then removed below
            else:
                if not moved:  # another engine evicted it first
                    self._release(size)
                    return True
                with self._lock:
                    self._known.append((name, size))
                return True
        return remove_file(path) is None

    def _move_in(self, path: Path, name: str) -> bool:
        """Rename ``path`` into the pool as ``name``; False if it was gone already."""
        with open_dir(path.parent) as from_fd, open_dir(self.root) as pool_fd:
            try:
                os.replace(path.name, name, src_dir_fd=from_fd, dst_dir_fd=pool_fd)
            except FileNotFoundError:
                return False
        return True

    def claim(self, dir_fd: int, suffix: str) -> tuple[int, str] | None:
        """Rename a spare file to a new name (ending in ``suffix``) in the folder ``dir_fd``
        and open it for writing in place; (its fd, its name), or None if there is none.

        The caller writes from offset 0 and cuts the file to its new length.
        """
        while True:
            with self._lock:
                if not self._known:
                    return None
                name, size = self._known.pop()
            dest = f"{secrets.token_hex(8)}{suffix}"
            try:
                with open_dir(self.root) as pool_fd:
                    os.rename(name, dest, src_dir_fd=pool_fd, dst_dir_fd=dir_fd)
            except OSError:
                continue  # claimed by another engine, or gone
            self._release(size)
            fd = self._open_reusable(dir_fd, dest)
            if fd is not None:
                return fd, dest

    def _open_reusable(self, dir_fd: int, name: str) -> int | None:
        """An fd to write ``name`` in place if it is a file fit for reuse; else remove it."""
        fd = None
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(name, dir_fd=dir_fd).st_mode):  # never open a device
                fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
        if fd is not None:
            try:
                if fit_to_overwrite(fd, self.max_size):  # checked on what was opened
                    os.set_blocking(fd, True)
                    return fd
            except OSError:
                pass
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)  # in the caller's folder: never written
        return None

    def _release(self, size: int) -> None:
        with self._lock:
            self._nbytes = max(0, self._nbytes - size)

    def clear(self) -> OSError | None:
        """Remove every spare file; the first error met, if any."""
        first: OSError | None = None
        names: list[str] = []
        with (
            contextlib.suppress(OSError),
            open_dir(self.root) as pool_fd,
            os.scandir(pool_fd) as listing,
        ):
            names = [item.name for item in listing if item.name.endswith(_SUFFIX)]
        for name in names:
            error = remove_file(self.root / name)  # every file, whatever failed before
            first = first or error
        self.scan()
        return first
