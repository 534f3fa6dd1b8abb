"""DiskStore against whoever else can write its directory: misses, never harm.

Anyone who can write the tier directory may replace entries, shard folders, temporary
and spare files, and the generation record. That may only ever cause misses: never a
crash, a hang, a read larger than an entry can be, a write outside the directory, or
KV written into a file someone else owns or can reach.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvmux import codec
from kvmux.errors import CorruptEntry, StoreError
from kvmux.stores import DiskStore
from kvmux.stores import _files as files_module

ENTRY = 1000  # bytes of the entries that fill the stores below
LIMIT = 1 << 20  # the value limit of the stores that read planted huge files
HUGE = 8 << 30  # a sparse file that large takes no disk space


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _shard_key(shard: str, i: int) -> bytes:
    """A key whose entry file lies in the shard folder ``shard``."""
    return bytes.fromhex(shard) + i.to_bytes(15, "big")


def _entry_path(store: DiskStore, key: bytes) -> Path:
    name = key.hex()
    return store.root / name[:2] / f"{name}.kvx"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _fill(store: DiskStore, count: int) -> None:
    """Write ``count`` entries, oldest first, so that the store evicts into its spares."""
    for i in range(count):
        assert store.put(_key(i), bytes([i % 256]) * ENTRY)
        os.utime(_entry_path(store, _key(i)), (1000.0 + i, 1000.0 + i))


def _spares(store: DiskStore) -> list[Path]:
    return sorted((store.root / "spare").iterdir())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the tier that a hostile writer points links at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def _all_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if not p.is_dir())


# -- 1. reads are bounded by what an entry can be ---------------------------------------


@pytest.fixture
def read_guard(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fails any read asking for more than ``LIMIT + 1`` bytes; the sizes asked."""
    asked: list[int] = []
    real_read, real_readv = os.read, os.readv

    def read(fd: int, size: int) -> bytes:
        asked.append(size)
        assert size <= LIMIT + 1, f"a read of {size} bytes"
        return real_read(fd, size)

    def readv(fd: int, buffers: list[memoryview]) -> int:
        size = sum(memoryview(b).nbytes for b in buffers)
        asked.append(size)
        assert size <= LIMIT + 1, f"a read of {size} bytes"
        return real_readv(fd, buffers)

    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(os, "readv", readv)
    return asked


def _read_everything(store: DiskStore, key: bytes, buffer: bytearray) -> list[object]:
    """Every way the store reads an entry."""
    return [
        store.get(key),
        store.get_into(key, buffer),
        store.get_many([key]),
        store.head(key, 64),
        store.head_many([key], HUGE),
        store.contains(key),
    ]


def test_a_sparse_file_as_large_as_the_budget_is_a_miss_never_read(
    tmp_path: Path, read_guard: list[int]
) -> None:
    store = DiskStore(tmp_path / "kv", 16 << 30)  # a budget the huge file fits in
    store.limit_values(LIMIT)
    key = _key(1)
    assert store.put(key, b"v" * 100)
    os.truncate(_entry_path(store, key), HUGE)  # the entry replaced by a huge sparse file
    buffer = bytearray(2 * LIMIT)
    tracemalloc.start()
    try:
        results = _read_everything(store, key, buffer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert results == [None, None, [None], None, [None], False]
    assert read_guard == []  # never read at all
    assert peak < LIMIT // 4  # bookkeeping only: nothing near the file's size


def test_without_a_value_limit_reads_are_bounded_by_the_budget(
    tmp_path: Path, read_guard: list[int]
) -> None:
    store = DiskStore(tmp_path / "kv", LIMIT)
    key = _key(1)
    assert store.put(key, b"v" * 100)
    os.truncate(_entry_path(store, key), HUGE)
    assert _read_everything(store, key, bytearray(64)) == [None, None, [None], None, [None], False]
    assert read_guard == []


def test_entries_within_the_limit_read_whole(tmp_path: Path, read_guard: list[int]) -> None:
    store = DiskStore(tmp_path / "kv", 16 << 30)
    store.limit_values(LIMIT)
    value = bytes(range(256)) * (LIMIT // 256)  # exactly the limit
    assert store.put(_key(1), value)
    assert store.get(_key(1)) == value
    got = store.get_into(_key(1), bytearray(LIMIT + 1))
    assert got is not None and bytes(got) == value
    assert store.head(_key(1), 10) == value[:10]
    assert store.put(_key(2), value + b"x") is False  # larger than any read would take


def test_a_file_grown_past_the_limit_after_a_put_is_a_miss(
    tmp_path: Path, read_guard: list[int]
) -> None:
    store = DiskStore(tmp_path / "kv", 16 << 30)
    store.limit_values(LIMIT)
    assert store.put(_key(1), b"v" * 100)
    with open(_entry_path(store, _key(1)), "r+b") as handle:
        handle.truncate(LIMIT + 1)
    assert store.get(_key(1)) is None and not store.contains(_key(1))
    assert store.put(_key(1), b"w" * 100)  # not an entry: replaced
    assert store.get(_key(1)) == b"w" * 100


# -- 2. no symlink under the root is followed ------------------------------------------


def test_a_shard_replaced_by_a_symlink_takes_no_writes(tmp_path: Path, outside: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    assert store.put(_shard_key("ab", 0), b"before")
    shutil.rmtree(store.root / "ab")
    (store.root / "ab").symlink_to(outside, target_is_directory=True)
    for i in range(5):
        with pytest.raises(StoreError, match="write failed"):
            store.put(_shard_key("ab", i), b"secret kv")
    assert store.put_many_parts([(_shard_key("cd", 0), [b"elsewhere"])]) == [True]
    assert _all_files(outside) == []  # nothing was written through the link
    assert store.used_bytes() == len(b"before") + len(b"elsewhere")  # what it counts
    assert store.get(_shard_key("cd", 0)) == b"elsewhere"


def test_entries_behind_a_symlinked_shard_are_misses(
    tmp_path: Path, outside: Path, read_guard: list[int]
) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    key = _shard_key("ab", 1)
    planted = outside / f"{key.hex()}.kvx"
    planted.write_bytes(b"planted outside")
    (store.root / "ab").symlink_to(outside, target_is_directory=True)
    assert _read_everything(store, key, bytearray(64)) == [None, None, [None], None, [None], False]
    store.delete(key)
    assert store.walk() == []  # neither listed ...
    store.clear()
    _fill(store, 12)  # ... nor evicted, nor removed
    assert planted.read_bytes() == b"planted outside"


def test_a_symlinked_entry_is_a_miss_and_its_target_is_never_written(
    tmp_path: Path, outside: Path
) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    target = outside / "target"
    target.write_bytes(b"precious")
    key = _key(3)
    path = _entry_path(store, key)
    path.parent.mkdir()
    path.symlink_to(target)
    assert not store.contains(key)
    for read in (store.get, lambda k: store.get_into(k, bytearray(64)), lambda k: store.head(k, 4)):
        with pytest.raises(StoreError, match="read failed"):
            read(key)
    assert store.put(key, b"entry")  # replaces the link, not its target
    assert store.get(key) == b"entry" and not path.is_symlink()
    assert target.read_bytes() == b"precious"


@pytest.mark.parametrize("folder", ["tmp", "spare"])
def test_a_symlinked_tmp_or_spare_folder_is_never_written_through(
    tmp_path: Path, outside: Path, folder: str
) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 11)  # spares exist
    shutil.rmtree(store.root / folder)
    (store.root / folder).symlink_to(outside, target_is_directory=True)
    for i in range(100, 120):
        if folder == "tmp":  # nowhere to write: refused, a miss later, counted by the caller
            with pytest.raises(StoreError, match="write failed"):
                store.put(_key(i), b"n" * ENTRY)
        else:  # no spares to reuse: evicted files are removed, new ones created
            assert store.put(_key(i), b"n" * ENTRY) and store.get(_key(i)) == b"n" * ENTRY
    assert _all_files(outside) == []
    reopened = DiskStore(tmp_path / "kv", 10 * ENTRY)  # a new engine repairs the folder
    assert (reopened.root / folder).is_dir() and not (reopened.root / folder).is_symlink()
    assert reopened.put(_key(200), b"after")
    assert _all_files(outside) == []


def test_a_planted_tmp_folder_is_replaced_when_the_store_opens(
    tmp_path: Path, outside: Path
) -> None:
    root = tmp_path / "kv"
    root.mkdir()
    (root / "tmp").symlink_to(outside, target_is_directory=True)
    (root / "spare").write_bytes(b"a file where the folder goes")
    store = DiskStore(root, 1 << 20)
    assert _mode(root / "tmp") == 0o700 and _mode(root / "spare") == 0o700
    assert store.put(_key(1), b"v") and store.get(_key(1)) == b"v"
    assert _all_files(outside) == []


# -- 3. KV goes only into files this process created -----------------------------------


def _plant_spare(store: DiskStore, name: str, data: bytes = b"s" * ENTRY) -> Path:
    path = store.root / "spare" / f"{name}.spare"
    path.write_bytes(data)
    return path


@pytest.fixture
def held() -> Iterator[Callable[[Path], int]]:
    """Opens files to read them after the store unlinked them; closes them at the end."""
    fds: list[int] = []

    def hold(path: Path) -> int:
        fds.append(os.open(path, os.O_RDONLY))
        return fds[-1]

    yield hold
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("how", ["chown", "other-euid"])
def test_a_spare_owned_by_someone_else_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: Callable[[Path], int], how: str
) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    spare = _plant_spare(store, "foreign")
    os.chmod(spare, 0o644)  # another user's file, readable by them
    if how == "chown":
        if os.geteuid() != 0:
            pytest.skip("only root can give a file away")
        os.chown(spare, 12345, 12345)
    else:  # the store takes itself for another user: every spare is someone else's
        monkeypatch.setattr(files_module, "effective_uid", lambda: os.geteuid() + 1)
    fd, inode = held(spare), spare.stat().st_ino
    store._spares.scan()
    assert store.put(_key(1), b"k" * ENTRY)
    assert os.pread(fd, 2 * ENTRY, 0) == b"s" * ENTRY  # untouched
    assert _entry_path(store, _key(1)).stat().st_ino != inode
    assert _mode(_entry_path(store, _key(1))) == 0o600
    assert store.get(_key(1)) == b"k" * ENTRY
    assert list((store.root / "tmp").iterdir()) == []  # claimed, found unfit, removed


def test_a_hardlinked_spare_is_never_written(tmp_path: Path, outside: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    elsewhere = outside / "someone-elses-file"
    elsewhere.write_bytes(b"precious")
    os.link(elsewhere, store.root / "spare" / "linked.spare")
    store._spares.scan()
    assert store.put(_key(1), b"k" * ENTRY)
    assert elsewhere.read_bytes() == b"precious"
    assert elsewhere.stat().st_nlink == 1  # the planted link is gone, never written
    assert _entry_path(store, _key(1)).stat().st_ino != elsewhere.stat().st_ino


def test_a_spare_of_its_own_with_mode_0644_is_reused_as_0600(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    spare = _plant_spare(store, "mine")
    os.chmod(spare, 0o644)
    inode = spare.stat().st_ino
    store._spares.scan()
    assert store.put(_key(1), b"k" * ENTRY)
    path = _entry_path(store, _key(1))
    assert path.stat().st_ino == inode  # reused in place ...
    assert _mode(path) == 0o600  # ... made private before the KV went in
    assert store.get(_key(1)) == b"k" * ENTRY


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
def test_new_files_are_0600_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    monkeypatch.setattr("kvmux.stores.disk.DIRECT_MIN_BYTES", 0)
    store = DiskStore(tmp_path / "kv", 1 << 20, direct_writes=direct)
    old = os.umask(0)
    try:
        assert store.put(_key(1), b"v" * 4096)
        store.write_generation(b"record")
    finally:
        os.umask(old)
    assert _mode(_entry_path(store, _key(1))) == 0o600
    assert _mode(store.root / "generation") == 0o600


def test_a_temporary_name_taken_by_a_planted_file_is_never_opened(tmp_path: Path) -> None:
    folder = tmp_path / "tmp"
    folder.mkdir()
    taken = folder / "taken.part"
    taken.symlink_to(tmp_path / "target")
    names = iter(["taken", "free"])
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(files_module.secrets, "token_hex", lambda _: next(names))
            new_fd, name = files_module.create_temp(fd, ".part")
        os.close(new_fd)
    finally:
        os.close(fd)
    assert name == "free.part" and not (tmp_path / "target").exists()
    assert _mode(folder / name) == 0o600


# -- 4. non-regular files, garbage, a full disk ----------------------------------------


def _within(seconds: float, action: Callable[[], Any]) -> list[object]:
    """``action()``'s result or StoreError, asserting it returned within ``seconds``."""
    outcome: list[object] = []

    def attempt() -> None:
        try:
            outcome.append(action())
        except StoreError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), "blocked"
    return outcome


def test_a_spare_swapped_for_a_fifo_after_the_scan_never_blocks(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    spare = _plant_spare(store, "swapped")
    store._spares.scan()
    spare.unlink()
    os.mkfifo(spare)
    assert _within(5, lambda: store.put(_key(1), b"k" * ENTRY)) == [True]
    assert store.get(_key(1)) == b"k" * ENTRY


@pytest.mark.parametrize("planted", ["fifo", "directory", "symlink-to-fifo"])
def test_non_regular_entries_are_misses_that_never_block(tmp_path: Path, planted: str) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    path = _entry_path(store, _key(9))
    path.parent.mkdir()
    if planted == "fifo":
        os.mkfifo(path)
    elif planted == "directory":
        path.mkdir()
    else:  # a FIFO reached through a symlink stands for any special file
        os.mkfifo(tmp_path / "special")
        path.symlink_to(tmp_path / "special")
    reads: list[Callable[[], object]] = [
        lambda: store.get(_key(9)),
        lambda: store.get_into(_key(9), bytearray(64)),
        lambda: store.head(_key(9), 8),
        lambda: store.contains(_key(9)),
    ]
    for read in reads:
        outcome = _within(5, read)
        assert outcome[0] in (None, False) or isinstance(outcome[0], StoreError)


@pytest.mark.parametrize("planted", [b"", b"\x00" * 10, b"garbage" * 100], ids=len)
def test_empty_or_garbage_entries_are_misses(tmp_path: Path, planted: bytes) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    layer = codec.LayerSpec((4, 8), "float32")
    key = _key(1)
    assert store.put(key, codec.encode(b"ns", key, [layer], [bytes(layer.nbytes)]))
    _entry_path(store, key).write_bytes(planted)
    with pytest.raises(CorruptEntry):
        codec.decode(store.get(key) or b"", b"ns", key)


def _out_of_space_once(monkeypatch: pytest.MonkeyPatch, code: int) -> list[int]:
    """Makes the next writev fail with ``code``; the calls so far."""
    real_writev, calls = os.writev, []

    def writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(code, os.strerror(code))
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    return calls


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=errno.errorcode.get)
def test_a_full_disk_frees_room_and_writes_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 11)  # full: nine entries and a spare
    assert _spares(store)
    calls = _out_of_space_once(monkeypatch, code)
    assert store.put(_key(100), b"n" * ENTRY)
    assert len(calls) == 2  # failed, then written
    assert store.get(_key(100)) == b"n" * ENTRY
    assert _spares(store) == [] and not store.contains(_key(2))  # the spare, then the oldest
    assert list((store.root / "tmp").iterdir()) == []
    assert store.used_bytes() == sum(p.stat().st_size for p in store.root.rglob("*.kvx"))


def test_a_disk_that_stays_full_fails_the_put_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 3)

    def full(fd: int, buffers: list[memoryview]) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    with pytest.raises(StoreError, match="No space left"):
        store.put(_key(100), b"n" * ENTRY)
    monkeypatch.undo()
    assert not store.contains(_key(100))
    assert list((store.root / "tmp").iterdir()) == []
    assert store.used_bytes() == sum(p.stat().st_size for p in store.root.rglob("*.kvx"))
    assert store.put(_key(100), b"n" * ENTRY)


def test_other_write_errors_are_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 3)
    calls: list[int] = []

    def broken(fd: int, buffers: list[memoryview]) -> int:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "writev", broken)
    with pytest.raises(StoreError, match="write failed"):
        store.put(_key(100), b"n" * ENTRY)
    assert len(calls) == 1 and all(store.contains(_key(i)) for i in range(3))


# -- 5. the generation record ----------------------------------------------------------


def test_a_symlinked_generation_file_is_never_followed(tmp_path: Path, outside: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    target = outside / "record"
    target.write_bytes(b"planted record")
    (store.root / "generation").symlink_to(target)
    assert store.read_generation() is None  # no record: the engine writes its own
    store.write_generation(b"ours")  # replaces the link, not its target
    assert store.read_generation() == b"ours"
    assert target.read_bytes() == b"planted record"
    assert not (store.root / "generation").is_symlink()


def test_the_generation_is_never_written_through_a_symlinked_tmp(
    tmp_path: Path, outside: Path
) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    shutil.rmtree(store.root / "tmp")
    (store.root / "tmp").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="generation failed"):
        store.write_generation(b"record")
    assert _all_files(outside) == [] and store.read_generation() is None


@pytest.mark.parametrize("planted", ["folder", "fifo"])
def test_a_generation_that_is_no_file_is_no_record_and_is_replaced(
    tmp_path: Path, planted: str
) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    target = store.root / "generation"
    if planted == "folder":
        target.mkdir()
        (target / "inside").write_bytes(b"x")
    else:
        os.mkfifo(target)
    assert store.read_generation() is None
    store.write_generation(b"ours")
    assert store.read_generation() == b"ours"


def test_a_planted_huge_file_is_evicted_before_any_entry(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    store.limit_values(64 << 10)
    for i in range(4):
        assert store.put(bytes([i]) * 16, bytes(32 << 10))
    planted = store.root / "ab" / ("ab" * 16 + ".kvx")
    planted.parent.mkdir(exist_ok=True)
    with planted.open("wb") as handle:
        handle.truncate(8 << 30)  # sparse, far over the budget
    for i in range(10, 20):  # writes rescan the directory: over budget, it evicts
        assert store.put(bytes([i]) * 16, bytes(32 << 10))
    assert not planted.exists()
    assert all(store.contains(bytes([i]) * 16) for i in (0, 1, 2, 3, *range(10, 20)))
