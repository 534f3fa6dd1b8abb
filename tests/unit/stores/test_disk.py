"""DiskStore specifics: permissions, sharing, atomic files, safe names, errors."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores import DiskStore
from kvmux.stores import disk as disk_module
from kvmux.stores.base import GENERATION_RECORD_MAX


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in _files(root))


def _set_mtime(store: DiskStore, key: bytes, when: float) -> None:
    os.utime(_entry_path(store, key), (when, when))


def _entry_path(store: DiskStore, key: bytes) -> Path:
    name = key.hex()
    return store.root / name[:2] / f"{name}.kvx"


def test_files_are_0600_and_directories_0700(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    for i in range(0, 256 * 3, 37):
        assert store.put(_key(i)[::-1], b"secret")
    assert _mode(store.root) == 0o700
    files = _files(store.root)
    assert len(files) == len(range(0, 256 * 3, 37))
    for path in files:
        assert _mode(path) == 0o600
        assert _mode(path.parent) == 0o700
    for folder in store.root.rglob("*"):
        if folder.is_dir():
            assert _mode(folder) == 0o700


def test_an_existing_directory_keeps_its_owners_mode(tmp_path: Path) -> None:
    """The store never chmods a directory it did not create (a shared group folder, say)."""
    root = tmp_path / "kv"
    root.mkdir(mode=0o2770)
    os.chmod(root, 0o2770)
    store = DiskStore(root, 1000)
    assert _mode(root) == 0o2770
    assert _mode(store.root / "tmp") == 0o700  # what it creates is private


def test_nested_path_is_created(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "a" / "b" / "c", 1000)
    assert store.root.is_dir()
    assert store.put(_key(1), b"v")
    assert store.get(_key(1)) == b"v"


def test_entry_file_layout_is_hex_of_the_key(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    key = bytes.fromhex("ab" * 16)
    store.put(key, b"value")
    path = store.root / "ab" / ("ab" * 16 + ".kvx")
    assert path.read_bytes() == b"value"


def test_second_instance_sees_entries_of_the_first(tmp_path: Path) -> None:
    first = DiskStore(tmp_path / "kv", 1 << 20)
    for i in range(5):
        first.put(_key(i), f"value-{i}".encode())
    second = DiskStore(tmp_path / "kv", 1 << 20)
    assert second.used_bytes() == first.used_bytes() == 5 * 7
    for i in range(5):
        assert second.contains(_key(i))
        assert second.get(_key(i)) == f"value-{i}".encode()
    assert second.count_prefix([_key(i) for i in range(7)]) == 5
    # and the other way round, after both are open
    second.put(_key(99), b"from-second")
    assert first.get(_key(99)) == b"from-second"
    second.delete(_key(0))
    assert not first.contains(_key(0))


_CHILD = """
import sys
from pathlib import Path
from kvmux.stores import DiskStore
store = DiskStore(Path(sys.argv[1]), 1 << 20)
if sys.argv[2] == "put":
    assert store.put(bytes.fromhex(sys.argv[3]), bytes.fromhex(sys.argv[4]))
else:
    value = store.get(bytes.fromhex(sys.argv[3]))
    print("MISSING" if value is None else value.hex())
"""


def _child(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return proc.stdout.strip()


def test_entries_are_shared_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    value = bytes(range(256)) * 4
    _child(str(root), "put", _key(7).hex(), value.hex())
    store = DiskStore(root, 1 << 20)
    assert store.get(_key(7)) == value
    assert store.used_bytes() == len(value)

    store.put(_key(8), b"parent wrote this")
    assert bytes.fromhex(_child(str(root), "get", _key(8).hex())) == b"parent wrote this"
    assert _child(str(root), "get", _key(9).hex()) == "MISSING"


def test_no_temporary_files_are_left_behind(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 5000)
    for i in range(60):
        store.put(_key(i), bytes([i]) * 200)  # also forces evictions
        store.put(_key(i), b"again")  # second put of an existing key
    tmp_dir = store.root / "tmp"
    assert tmp_dir.is_dir()
    assert list(tmp_dir.iterdir()) == []
    for path in _files(store.root):
        assert path.suffix == ".kvx"
        assert not path.name.endswith(".part")


@pytest.mark.parametrize(
    "key",
    [b"../../../escaped", b"/etc/passwd\x00\x00\x00\x00\x00", b"..\\..\\x", b"a/../../b", b""],
    ids=["dotdot", "absolute", "backslash", "mixed", "empty"],
)
def test_keys_cannot_escape_the_directory(tmp_path: Path, key: bytes) -> None:
    root = tmp_path / "sandbox" / "kv"
    store = DiskStore(root, 1 << 20)
    assert store.put(key, b"payload")
    assert store.get(key) == b"payload"
    outside = [
        p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(root.resolve())
    ]
    assert outside == []
    for path in _files(root):
        stem = path.name.removesuffix(".kvx")
        assert set(stem) <= set("0123456789abcdef")
        assert path.resolve().is_relative_to(root.resolve())


def test_unwritable_path_raises_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "regular-file"
    blocker.write_text("not a directory")
    path = blocker / "kv"
    with pytest.raises(StoreUnavailable) as info:
        DiskStore(path, 1000, name="blocked")
    assert str(path) in str(info.value)
    assert "blocked" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


def test_root_that_is_a_file_raises_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(StoreUnavailable, match=str(path)):
        DiskStore(path, 1000)


def test_get_refreshes_recency(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    store.put(_key(1), b"v")
    _set_mtime(store, _key(1), 1_000_000)
    assert store.get(_key(1)) == b"v"
    assert _entry_path(store, _key(1)).stat().st_mtime > 1_000_000


def test_get_into_reads_into_the_buffer_and_refreshes_recency(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    store.put(_key(1), b"value")
    _set_mtime(store, _key(1), 1_000_000)
    buffer = bytearray(b"x" * 64)
    got = store.get_into(_key(1), buffer)
    assert isinstance(got, memoryview) and got.obj is buffer and bytes(got) == b"value"
    assert buffer[5:] == b"x" * 59  # nothing past the entry was touched
    assert _entry_path(store, _key(1)).stat().st_mtime > 1_000_000
    untouched = DiskStore(tmp_path / "kv", 1000, touch=False)
    _set_mtime(store, _key(1), 1_000_000)
    assert untouched.get_into(_key(1), buffer) is not None
    assert _entry_path(store, _key(1)).stat().st_mtime == 1_000_000


def test_eviction_removes_the_oldest_files_first(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    for i in range(9):
        assert store.put(_key(i), bytes([i]) * 100)
    # Explicit ages: key 4 is oldest, then 7, then the rest.
    for i in range(9):
        _set_mtime(store, _key(i), 2_000_000 + 1000 * i)
    _set_mtime(store, _key(4), 1_000_000)
    _set_mtime(store, _key(7), 1_500_000)
    assert store.put(_key(100), b"n" * 200)  # 1100 bytes > 1000: evict down to 900
    assert not store.contains(_key(4))
    assert not store.contains(_key(7))
    assert store.contains(_key(100))
    assert sum(store.contains(_key(i)) for i in range(9)) == 7
    assert store.used_bytes() == 900
    assert _disk_bytes(store.root) == 1000  # key 4's file kept as a spare (10% of the budget)


def test_eviction_accounts_for_other_writers(tmp_path: Path) -> None:
    first = DiskStore(tmp_path / "kv", 1000)
    second = DiskStore(tmp_path / "kv", 1000)
    for i in range(5):
        second.put(_key(i), b"s" * 100)
    for i in range(5, 16):
        first.put(_key(i), b"f" * 100)
    # first rescans the shared directory every 10% of the budget it writes, so it sees
    # second's entries and evicts them too: the directory never ends above the budget
    assert _disk_bytes(first.root) <= 1000
    assert not all(second.contains(_key(i)) for i in range(5))
    assert first.used_bytes() == _disk_bytes(first.root)


def test_shared_directory_never_exceeds_the_budget(tmp_path: Path) -> None:
    first = DiskStore(tmp_path / "kv", 1000)
    second = DiskStore(tmp_path / "kv", 1000)
    assert first.put(_key(1), b"a" * 600)
    assert second.put(_key(2), b"b" * 600)
    assert _disk_bytes(first.root) <= 1000


def test_put_true_means_the_entry_is_stored(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    assert store.put(_key(1), b"a" * 50)
    if store.put(_key(2), b"b" * 960):  # 1010 bytes: evicts down to 900 bytes
        assert store.get(_key(2)) == b"b" * 960


def test_clear_removes_every_entry_file(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    for i in range(20):
        store.put(_key(i * 13), b"x" * 10)
    store.clear()
    assert _files(store.root) == []
    assert store.used_bytes() == 0


def test_read_error_is_a_store_error(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    path = _entry_path(store, _key(3))
    path.mkdir(parents=True)  # a directory where the entry file should be
    with pytest.raises(StoreError, match="read failed"):
        store.get(_key(3))


def test_write_error_is_a_store_error_and_leaves_no_temp(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    key = bytes.fromhex("cd" * 16)
    (store.root / "cd").write_text("a file where the shard directory should be")
    with pytest.raises(StoreError, match="write failed"):
        store.put(key, b"value")
    assert list((store.root / "tmp").iterdir()) == []
    assert store.used_bytes() == 0


def test_failed_rename_removes_the_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 1000)

    def broken_replace(src: str, dst: object, **dir_fds: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_module.os, "replace", broken_replace)
    with pytest.raises(StoreError, match="No space left"):
        store.put(_key(1), b"value")
    monkeypatch.undo()
    assert list((store.root / "tmp").iterdir()) == []
    assert not store.contains(_key(1))
    assert store.used_bytes() == 0
    assert store.put(_key(1), b"value")
    assert store.get(_key(1)) == b"value"


def test_short_writes_are_resumed_until_every_part_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 10_000)
    real_writev, calls = os.writev, []

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers))
        return real_writev(fd, [buffers[0][:5]])  # at most 5 bytes of the first buffer

    monkeypatch.setattr(disk_module.os, "writev", short_writev)
    parts = [b"abcdefgh", memoryview(bytes(range(12))), b"", b"xyz"]
    assert store.put_many_parts([(_key(1), parts)]) == [True]
    assert store.get(_key(1)) == b"".join(parts)
    assert len(calls) == 6  # 5+3, 5+5+2, 3 bytes


def test_a_writev_that_writes_nothing_is_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    monkeypatch.setattr(disk_module.os, "writev", lambda fd, buffers: 0)
    with pytest.raises(StoreError, match="write failed"):
        store.put_many_parts([(_key(1), [b"value"])])
    monkeypatch.undo()
    assert list((store.root / "tmp").iterdir()) == []
    assert not store.contains(_key(1))
    assert store.used_bytes() == 0


def test_delete_error_is_a_store_error(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    path = _entry_path(store, _key(3))
    path.mkdir(parents=True)
    (path / "inner").write_text("x")
    with pytest.raises(StoreError, match="delete failed"):
        store.delete(_key(3))


def test_concurrent_puts_of_one_key_count_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path / "kv", 1 << 20)
    both_checked = threading.Barrier(2)
    real_create_temp = disk_module.create_temp

    def create_temp_after_both_checked(*args: Any, **kwargs: Any) -> tuple[int, str]:
        with contextlib.suppress(threading.BrokenBarrierError):
            both_checked.wait(timeout=5)  # only times out once puts are serialised
        return real_create_temp(*args, **kwargs)

    monkeypatch.setattr(disk_module, "create_temp", create_temp_after_both_checked)
    threads = [threading.Thread(target=store.put, args=(_key(1), b"v" * 100)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.undo()
    assert _disk_bytes(store.root) == 100
    assert store.used_bytes() == 100


def test_the_generation_record_is_shared_by_every_engine_on_the_directory(
    tmp_path: Path,
) -> None:
    one, other = DiskStore(tmp_path / "kv", 1000), DiskStore(tmp_path / "kv", 1000)
    assert one.read_generation() is None
    one.write_generation(b"first")
    assert other.read_generation() == b"first"
    other.write_generation(b"second")
    assert DiskStore(tmp_path / "kv", 1000).read_generation() == b"second"  # survives restarts


def test_a_planted_generation_file_reads_bounded_never_blocks(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 1000)
    (store.root / "generation").write_bytes(b"9" * 100_000)
    assert len(store.read_generation() or b"") == GENERATION_RECORD_MAX + 1
    (store.root / "generation").unlink()
    os.mkfifo(store.root / "generation")
    assert store.read_generation() is None  # a FIFO is no record, and never a hang
