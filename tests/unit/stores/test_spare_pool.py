"""Spare pool: a full disk tier overwrites its evicted files in place, never wrong KV."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmux import codec
from kvmux.errors import CorruptEntry
from kvmux.stores import DiskStore, spare_pool
from kvmux.stores._files import remove_file
from kvmux.stores.spare_pool import SparePool

ENTRY = 1000  # bytes of every entry below: ten fill a store of 10_000


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _entry_path(store: DiskStore, key: bytes) -> Path:
    name = key.hex()
    return store.root / name[:2] / f"{name}.kvx"


def _spares(store: DiskStore) -> list[Path]:
    return sorted((store.root / "spare").iterdir())


def _fill(store: DiskStore, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        assert store.put(_key(i), bytes([i % 256]) * ENTRY)
        os.utime(_entry_path(store, _key(i)), (1000.0 + i, 1000.0 + i))  # strict recency


def test_a_full_store_moves_evicted_files_to_spares_and_reuses_them(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 11)  # the eleventh evicts the oldest two, down to 90%
    spare_inodes = {path.stat().st_ino for path in _spares(store)}
    assert len(spare_inodes) == 1  # the pool holds 10% of the budget: one entry
    assert store.get(_key(0)) is None
    assert store.put(_key(100), b"n" * ENTRY)
    assert _entry_path(store, _key(100)).stat().st_ino in spare_inodes  # written in place
    assert _spares(store) == []
    assert store.get(_key(100)) == b"n" * ENTRY


def test_entries_and_spares_stay_within_the_budget(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    for i in range(200):
        assert store.put(_key(i), bytes([i % 256]) * (ENTRY - 300 + (i * 37) % 600))
        occupied = sum(p.stat().st_size for p in store.root.rglob("*") if p.is_file())
        assert occupied <= 10 * ENTRY


def test_a_longer_spare_is_cut_to_the_new_entry(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 11)
    assert store.put(_key(100), b"short")
    assert store.get(_key(100)) == b"short"
    assert _entry_path(store, _key(100)).stat().st_size == 5


def test_a_reader_of_an_evicted_entry_sees_a_mismatch_not_other_kv(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    layer = codec.LayerSpec((4, 8), "float32")

    def entry(key: bytes, fill: int) -> bytes:
        return codec.encode(b"ns", key, [layer], [bytes([fill]) * layer.nbytes])

    old_key, new_key = _key(1), _key(99)
    assert store.put(old_key, entry(old_key, 1))
    fd = os.open(_entry_path(store, old_key), os.O_RDONLY)  # a reader, before the eviction
    try:
        store._retire(_entry_path(store, old_key), os.fstat(fd).st_size)
        assert store.put(new_key, entry(new_key, 2))
        assert os.fstat(fd).st_ino == _entry_path(store, new_key).stat().st_ino
        stale_read = os.pread(fd, 1 << 16, 0)
    finally:
        os.close(fd)
    with pytest.raises(CorruptEntry):
        codec.decode(stale_read, b"ns", old_key)
    assert codec.decode(stale_read, b"ns", new_key).payload  # the new entry, intact


def test_planted_spares_are_removed_never_written_through(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    spare = store.root / "spare"
    os.symlink(outside, spare / "aa.spare")
    os.link(outside, spare / "bb.spare")
    (spare / "cc.spare").mkdir()
    store._spares.scan()
    assert store.put(_key(1), b"x" * ENTRY)
    assert outside.read_bytes() == b"precious"
    assert store.get(_key(1)) == b"x" * ENTRY
    assert not (spare / "bb.spare").exists()  # claimed, found linked, removed
    assert (spare / "aa.spare").is_symlink() and (spare / "cc.spare").is_dir()  # never claimed


def test_a_spare_is_claimed_once_between_engines(tmp_path: Path) -> None:
    pool_dir = tmp_path / "spare"
    pool_dir.mkdir()
    (pool_dir / "one.spare").write_bytes(b"s" * 10)
    first, second = SparePool(pool_dir, 100, 100), SparePool(pool_dir, 100, 100)
    first.scan(), second.scan()
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        claimed = first.claim(dir_fd, ".part")
        assert claimed is not None
        fd, name = claimed
        os.close(fd)
        assert name.endswith(".part")
        assert (tmp_path / name).read_bytes() == b"s" * 10  # the spare itself, renamed
        assert second.claim(dir_fd, ".part") is None
    finally:
        os.close(dir_fd)
    assert second.nbytes == 10 and second.scan() == 0  # the next scan sees it gone


def test_a_full_pool_removes_what_it_cannot_keep(tmp_path: Path) -> None:
    pool_dir = tmp_path / "spare"
    pool_dir.mkdir()
    pool = SparePool(pool_dir, 15, 100)
    files = [tmp_path / f"e{i}" for i in range(3)]
    for path in files:
        path.write_bytes(b"e" * 10)
        assert pool.retire(path, 10)
    assert not any(path.exists() for path in files)
    assert pool.nbytes == 10 and len(list(pool_dir.iterdir())) == 1


def test_direct_writes_remove_evicted_files(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY, direct_writes=True)
    if not store.writes_directly:
        pytest.skip("no O_DIRECT on this platform")
    _fill(store, 11)
    assert _spares(store) == []


def test_clear_removes_spares(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "kv", 10 * ENTRY)
    _fill(store, 11)
    assert _spares(store)
    store.clear()
    assert _spares(store) == [] and store._spares.nbytes == 0


def test_clear_goes_on_past_a_file_it_cannot_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool_dir = tmp_path / "spare"
    pool_dir.mkdir()
    for name in ("a", "b", "c"):
        (pool_dir / f"{name}.spare").write_bytes(b"s")
    refused = OSError(13, "refused")
    calls: list[Path] = []

    def first_refused(path: Path) -> OSError | None:
        calls.append(path)
        return refused if len(calls) == 1 else remove_file(path)

    monkeypatch.setattr(spare_pool, "remove_file", first_refused)
    assert SparePool(pool_dir, 100, 100).clear() is refused
    assert len(calls) == 3
    assert sorted(p.name for p in pool_dir.iterdir()) == [calls[0].name]  # only the refused
