"""Evicting a disk tier's files from the page cache, so that a timed read is a cold one.

``posix_fadvise(POSIX_FADV_DONTNEED)`` needs no root, unlike ``/proc/sys/vm/drop_caches``,
and drops only the files it is given. Dirty pages are not dropped, so each file is
written back (``fdatasync``) first. Where Python has no ``os.posix_fadvise`` (macOS)
nothing is evicted and the benchmark says so (``page_cache_state``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CAN_EVICT", "evict_page_cache", "page_cache_state"]

CAN_EVICT = hasattr(os, "posix_fadvise")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _regular_files(directory: Path, modified_since: float | None) -> Iterator[str]:
    """Paths of the regular files under ``directory``, symlinks not followed."""
    pending = [str(directory)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                        elif entry.is_file(follow_symlinks=False) and (
                            modified_since is None
                            or entry.stat(follow_symlinks=False).st_mtime >= modified_since
                        ):
                            yield entry.path
                    except OSError:
                        continue
        except OSError:
            continue


def _evict(path: str) -> bool:
    """Write back and drop the cached pages of one file; False if it cannot be opened."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return False
    try:
        with contextlib.suppress(OSError):
            os.fdatasync(fd)  # dirty pages stay cached: write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def evict_page_cache(directory: Path, modified_since: float | None = None) -> int:
    """Evict the files under ``directory`` (modified since ``modified_since``, if set); how many."""
    if not CAN_EVICT:
        return 0
    return sum(_evict(path) for path in _regular_files(Path(directory), modified_since))


def page_cache_state(evicted: int) -> str:
    """How a cold read's files stood in the page cache, for the results."""
    if not CAN_EVICT:
        return "not evicted (no os.posix_fadvise here)"
    return f"evicted ({evicted} files, posix_fadvise DONTNEED)"
