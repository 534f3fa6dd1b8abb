"""DiskStore under OS errors and planted files: a StoreError or a miss, never an OSError.

The tests run as root, so permissions cannot make EACCES: ``os`` functions are replaced
with ones that fail with a chosen errno for paths under the store (and the descriptors
opened on them); every other path goes through untouched.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores import DiskStore

ERRNOS = [errno.EACCES, errno.ESTALE, errno.EIO, errno.ENOSPC, errno.EROFS]
PATH_FUNCTIONS = ["lstat", "stat", "open", "unlink", "replace", "scandir", "utime", "mkdir"]
FD_FUNCTIONS = ["read", "readv", "fstat", "close"]


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _entry_path(store: DiskStore, key: bytes) -> Path:
    name = key.hex()
    return store.root / name[:2] / f"{name}.kvx"


class Faults:
    """Makes chosen ``os`` functions fail with one errno on paths under ``root``.

    The store opens names relative to descriptors of their folders: such a name counts
    by its folder's path. Descriptors of folders and entry files opened under ``root``
    count as under it, so that listings, reads, fstat and close on them can fail too.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path, code: int):
        self.root = str(root)
        self.code = code
        self.fds: set[int] = set()  # entry files opened under root
        self.dirs: dict[int, str] = {}  # every folder opened, by descriptor
        self.failing: set[str] = set()
        self.calls: dict[str, int] = {}
        for name in PATH_FUNCTIONS + FD_FUNCTIONS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _path(self, arg: Any, dir_fd: int | None) -> str | None:
        """The path ``arg`` names (relative to the folder ``dir_fd``), if known."""
        if isinstance(arg, int):
            return self.dirs.get(arg)
        if not isinstance(arg, str | os.PathLike):
            return None
        path = os.fspath(arg)
        if dir_fd is None or os.path.isabs(path):
            return str(path)
        base = self.dirs.get(dir_fd)
        return None if base is None else os.path.join(base, str(path))

    def _ours(self, arg: Any, dir_fd: int | None = None) -> bool:
        if isinstance(arg, int) and arg in self.fds:
            return True
        path = self._path(arg, dir_fd)
        return path is not None and path.startswith(self.root)

    def _targets(self, name: str, args: Any, kwargs: dict[str, Any]) -> list[tuple[Any, Any]]:
        if name == "replace":
            return [(args[0], kwargs.get("src_dir_fd")), (args[1], kwargs.get("dst_dir_fd"))]
        return [(args[0], kwargs.get("dir_fd"))]

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def fake(*args: Any, **kwargs: Any) -> Any:
            ours = any(self._ours(a, d) for a, d in self._targets(name, args, kwargs))
            if name == "close":
                self.fds.discard(args[0])
                self.dirs.pop(args[0], None)
            if ours:
                self.calls[name] = self.calls.get(name, 0) + 1
                if name in self.failing:
                    if name == "close":
                        real(*args)  # Linux releases the descriptor even when close fails
                    raise OSError(self.code, os.strerror(self.code), str(args[0]))
            result = real(*args, **kwargs)
            if name == "open":
                self._opened(result, args, kwargs, ours)
            return result

        return fake

    def _opened(self, fd: int, args: Any, kwargs: dict[str, Any], ours: bool) -> None:
        """Note what the new descriptor ``fd`` is (its number may be a reused one)."""
        self.fds.discard(fd)
        self.dirs.pop(fd, None)
        path = self._path(args[0], kwargs.get("dir_fd"))
        if path is not None and args[1] & os.O_DIRECTORY:
            self.dirs[fd] = path
        elif ours and str(path).endswith(".kvx"):
            self.fds.add(fd)

    def fail(self, *names: str) -> None:
        """From now on, these functions fail."""
        self.failing.update(names)

    def heal(self) -> None:
        """From now on, nothing fails."""
        self.failing.clear()


def _read_into(store: DiskStore, key: bytes) -> bytes | None:
    """``get_into`` with a buffer that fits every entry of these tests, as bytes."""
    got = store.get_into(key, bytearray(2000))
    return None if got is None else bytes(got)


READS: dict[str, Callable[[DiskStore, bytes], bytes | None]] = {
    "get": DiskStore.get,
    "get_into": _read_into,
}


@pytest.fixture(params=list(READS))
def read(request: pytest.FixtureRequest) -> Callable[[DiskStore, bytes], bytes | None]:
    """Each way of reading an entry: into fresh bytes, or into a caller's buffer."""
    return READS[request.param]


@pytest.fixture
def store(tmp_path: Path) -> DiskStore:
    store = DiskStore(tmp_path / "kv", 1000)
    for i in range(4):
        assert store.put(_key(i), bytes([i]) * 100)
    return store


def _exercise(store: DiskStore) -> None:
    """Every method once, on present and absent keys; only StoreError may escape."""
    operations: list[tuple[Callable[[], object], Callable[[object], bool]]] = [
        (lambda: store.get(_key(0)), lambda r: r in (None, bytes(100))),
        (lambda: store.get(_key(99)), lambda r: r is None),
        (lambda: _read_into(store, _key(0)), lambda r: r in (None, bytes(100))),
        (lambda: _read_into(store, _key(99)), lambda r: r is None),
        (lambda: store.get_many([_key(1), _key(99)]), lambda r: r[1] is None),  # type: ignore[index]
        (lambda: store.contains(_key(1)), lambda r: isinstance(r, bool)),
        (lambda: store.contains_many([_key(1), _key(99)]), lambda r: r[1] is False),  # type: ignore[index]
        (lambda: store.count_prefix([_key(1), _key(2), _key(99)]), lambda r: r in (0, 1, 2)),
        (lambda: store.put(_key(1), b"other"), lambda r: r is True),
        (lambda: store.put(_key(5), b"new"), lambda r: r is True),
        (lambda: store.put_many([(_key(6), b"x" * 400), (_key(7), b"y" * 400)]), bool),
        (lambda: store.delete(_key(2)), lambda r: r is None),
        (lambda: store.delete(_key(99)), lambda r: r is None),
        (lambda: store.used_bytes(), lambda r: isinstance(r, int) and r >= 0),
        (lambda: store.clear(), lambda r: r is None),
    ]
    for operation, plausible in operations:
        try:
            result = operation()
        except StoreError:
            continue
        assert plausible(result), result


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("function", PATH_FUNCTIONS + FD_FUNCTIONS + ["all"])
def test_every_os_error_is_a_store_error_or_a_miss(
    store: DiskStore, monkeypatch: pytest.MonkeyPatch, function: str, code: int
) -> None:
    faults = Faults(monkeypatch, store.root, code)
    faults.fail(*(PATH_FUNCTIONS + FD_FUNCTIONS if function == "all" else [function]))
    _exercise(store)
    assert function in ("all", "stat") or faults.calls.get(function), "the fault was never hit"
    faults.heal()
    assert store.put(_key(50), b"after") and store.get(_key(50)) == b"after"
    if function not in ("unlink", "all"):
        assert list((store.root / "tmp").iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize("code", [errno.ESTALE, errno.EIO, errno.EACCES], ids=errno.errorcode.get)
def test_lookups_translate_stat_errors(
    store: DiskStore, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    Faults(monkeypatch, store.root, code).fail("stat", "lstat")
    with pytest.raises(StoreError, match="lookup failed"):
        store.contains(_key(0))
    with pytest.raises(StoreError, match="lookup failed"):
        store.count_prefix([_key(0), _key(1)])
    with pytest.raises(StoreError, match="write failed"):
        store.put(_key(0), b"v")


def test_a_file_eviction_cannot_remove_is_skipped(
    store: DiskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(monkeypatch, _entry_path(store, _key(0)), errno.EACCES)  # the oldest
    os.utime(_entry_path(store, _key(0)), (1, 1))
    faults.fail("unlink")
    faults.fail("replace")  # neither removed nor moved to the spare pool
    assert store.put(_key(10), b"n" * 700)  # 1100 bytes: evicts, but not key 0
    assert store.contains(_key(0)) and store.contains(_key(10))
    assert store.used_bytes() <= 900


def test_clear_reports_a_file_it_cannot_remove(
    store: DiskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    Faults(monkeypatch, _entry_path(store, _key(1)), errno.EIO).fail("unlink")
    with pytest.raises(StoreError, match="clear failed"):
        store.clear()
    assert [store.contains(_key(i)) for i in range(4)] == [False, True, False, False]
    assert store.used_bytes() == 100


def test_unreadable_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "kv"
    DiskStore(root, 1000).put(_key(1), b"v")
    faults = Faults(monkeypatch, root, errno.EIO)
    faults.fail("scandir")
    with pytest.raises(StoreUnavailable):
        DiskStore(root, 1000)
    faults.heal()
    store = DiskStore(root, 1000)
    faults.fail("scandir")
    with pytest.raises(StoreError, match="scan failed"):
        store.clear()


def test_an_unreadable_shard_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "kv"
    first = DiskStore(root, 1000)
    first.put(b"\x01" * 16, b"v" * 10)
    first.put(b"\x02" * 16, b"w" * 20)  # another shard
    Faults(monkeypatch, root / "01", errno.EIO).fail("scandir")
    assert DiskStore(root, 1000).used_bytes() == 20


# -- planted files --------------------------------------------------------------------


def test_a_file_larger_than_the_budget_is_a_miss_never_read(
    store: DiskStore,
    monkeypatch: pytest.MonkeyPatch,
    read: Callable[[DiskStore, bytes], bytes | None],
) -> None:
    path = _entry_path(store, _key(9))
    path.parent.mkdir(exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)  # sparse: 1 MiB, over the 1000-byte budget
    faults = Faults(monkeypatch, store.root, errno.EIO)
    assert read(store, _key(9)) is None
    assert not store.contains(_key(9))
    assert "read" not in faults.calls and "readv" not in faults.calls


def test_a_file_that_grows_while_read_is_a_miss(
    store: DiskStore,
    monkeypatch: pytest.MonkeyPatch,
    read: Callable[[DiskStore, bytes], bytes | None],
) -> None:
    real_fstat = os.fstat

    def stale_fstat(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        fields = list(info)
        fields[6] = 10  # st_size as it was before a writer appended
        return os.stat_result(fields)

    monkeypatch.setattr(os, "fstat", stale_fstat)
    assert read(store, _key(0)) is None


def test_a_file_that_vanishes_after_its_lookup_is_a_miss(
    store: DiskStore, read: Callable[[DiskStore, bytes], bytes | None]
) -> None:
    assert store.contains(_key(0))
    _entry_path(store, _key(0)).unlink()
    assert read(store, _key(0)) is None


def test_a_directory_where_an_entry_should_be(store: DiskStore) -> None:
    path = _entry_path(store, _key(9))
    path.mkdir(parents=True)
    assert not store.contains(_key(9))
    with pytest.raises(StoreError, match="read failed"):
        store.get(_key(9))
    with pytest.raises(StoreError, match="write failed"):
        store.put(_key(9), b"v")
    assert list((store.root / "tmp").iterdir()) == []


def test_a_symlink_is_not_followed(
    store: DiskStore, tmp_path: Path, read: Callable[[DiskStore, bytes], bytes | None]
) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"not an entry")
    path = _entry_path(store, _key(9))
    path.parent.mkdir(exist_ok=True)
    path.symlink_to(outside)
    assert not store.contains(_key(9))
    with pytest.raises(StoreError):
        read(store, _key(9))
    assert store.put(_key(9), b"entry")  # replaces the link, not its target
    assert read(store, _key(9)) == b"entry"
    assert outside.read_bytes() == b"not an entry"


def test_a_fifo_does_not_hang_a_read(
    store: DiskStore, read: Callable[[DiskStore, bytes], bytes | None]
) -> None:
    path = _entry_path(store, _key(9))
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
    outcome: list[object] = []

    def attempt() -> None:
        try:
            outcome.append(read(store, _key(9)))
        except StoreError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=attempt, daemon=True)
    reader.start()
    reader.join(timeout=5)
    blocked = reader.is_alive()
    if blocked:  # release the reader: open the FIFO's other end
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
    assert not blocked, "a read blocked on a FIFO"
    assert outcome and (outcome[0] is None or isinstance(outcome[0], StoreError))
    assert not store.contains(_key(9))
