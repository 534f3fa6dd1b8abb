"""File helpers the file-backed stores share, safe in a directory others can write.

A name in a store's directory is always opened relative to a descriptor of its folder,
never through a symlink: the folder itself is opened with ``O_NOFOLLOW`` (only the
store's root, which its operator names, may be reached through one). A file is written
only if this process created it (``O_CREAT | O_EXCL``) or, to reuse it, found it a regular
file of its own with one link (``fit_to_overwrite``), made 0600 before any write.
The readers and writers of open descriptors below never ask for more than told.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "FILE_MODE",
    "READ_FLAGS",
    "create_temp",
    "effective_uid",
    "fit_to_overwrite",
    "make_private_dir",
    "open_dir",
    "out_of_space",
    "read_at_most",
    "read_head",
    "read_into",
    "remove_file",
    "write_all",
]

FILE_MODE = 0o600  # every file a store writes
# non-blocking so that a planted FIFO cannot hang a read; never through a planted symlink
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_TEMP_TRIES = 16  # random names tried before giving up (a clash needs a planted name)
_IOV_MAX = 1024  # buffers per writev (POSIX guarantees at least 16; Linux takes 1024)


def effective_uid() -> int:
    """The user this process writes files as (tests replace it to play another owner)."""
    return os.geteuid()


@contextlib.contextmanager
def open_dir(path: Path | str, follow: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``path``, closed on leaving.

    Unless ``follow``, a symlink in its last component is refused (``NotADirectoryError``,
    as for anything that is no directory); the components above it are trusted.
    """
    fd = os.open(path, _DIR_FLAGS if follow else _DIR_FLAGS | os.O_NOFOLLOW)
    try:
        yield fd
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def create_temp(dir_fd: int, suffix: str) -> tuple[int, str]:
    """Create a new file (mode 0600) under a random name in ``dir_fd``; (its fd, its name)."""
    for _ in range(_TEMP_TRIES - 1):
        name = secrets.token_hex(8) + suffix
        with contextlib.suppress(FileExistsError):
            return os.open(name, _NEW_FLAGS, FILE_MODE, dir_fd=dir_fd), name
    name = secrets.token_hex(8) + suffix
    return os.open(name, _NEW_FLAGS, FILE_MODE, dir_fd=dir_fd), name


def fit_to_overwrite(fd: int, max_size: int) -> bool:
    """Whether the open file may be overwritten in place; if so it is made 0600 first.

    Only a regular file this process's user owns, with no other link, of at most
    ``max_size`` bytes: KV never goes into a file that someone else owns or can reach.
    """
    info = os.fstat(fd)
    mine = info.st_uid == effective_uid() and info.st_nlink == 1
    if not (stat.S_ISREG(info.st_mode) and mine and info.st_size <= max_size):
        return False
    if stat.S_IMODE(info.st_mode) != FILE_MODE:
        os.fchmod(fd, FILE_MODE)
    return True


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or the OSError it was raised from) says the disk or quota is full."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    return isinstance(cause, OSError) and cause.errno in _OUT_OF_SPACE


def remove_file(path: Path) -> OSError | None:
    """Remove ``path``; the error if it could not be removed (a vanished file is removed).

    Its folder is opened without following a symlink, so nothing outside it is removed.
    """
    try:
        with open_dir(path.parent) as dir_fd:
            os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def make_private_dir(folder: Path) -> None:
    """Create ``folder`` (0700) unless it is a directory; a symlink or file there goes first."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            os.unlink(folder)  # planted where the store's own folder belongs
    with contextlib.suppress(FileExistsError):  # never chmod what it did not create
        os.mkdir(folder, 0o700)
        with open_dir(folder) as fd:
            os.fchmod(fd, 0o700)


def write_all(fd: int, parts: Sequence[memoryview | bytes]) -> None:
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


def read_head(fd: int, size: int) -> bytes:
    """The file's first ``size`` bytes (all of a shorter file)."""
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_at_most(fd: int, size: int) -> bytes | None:
    """The file's bytes, or None if it holds more than ``size`` (it grew meanwhile)."""
    data = read_head(fd, size + 1)
    return data if len(data) <= size else None


def read_into(fd: int, view: memoryview) -> int:
    """Fill ``view`` from the file (less at its end); the bytes read."""
    filled = 0
    while filled < view.nbytes:
        count = os.readv(fd, [view[filled:]])
        if count <= 0:
            break
        filled += count
    return filled
