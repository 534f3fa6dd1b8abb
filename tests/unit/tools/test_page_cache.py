"""Evicting a disk tier's files from the page cache before a cold read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmux.tools import page_cache
from kvmux.tools.page_cache import evict_page_cache, page_cache_state

needs_fadvise = pytest.mark.skipif(not page_cache.CAN_EVICT, reason="no os.posix_fadvise")


@needs_fadvise
def test_every_regular_file_is_evicted_and_counted(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for path in (tmp_path / "a.bin", tmp_path / "sub" / "b.bin"):
        path.write_bytes(os.urandom(64 * 1024))  # dirty pages: written back, then dropped
        assert len(path.read_bytes()) == 64 * 1024
    assert evict_page_cache(tmp_path) == 2
    assert (tmp_path / "a.bin").read_bytes()  # the files themselves are untouched
    assert page_cache_state(2) == "evicted (2 files, posix_fadvise DONTNEED)"


@needs_fadvise
def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.bin").write_bytes(b"x" * 4096)
    (outside / "y.bin").write_bytes(b"y" * 4096)
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "entry.bin").write_bytes(b"e" * 4096)
    (tier / "file-link").symlink_to(outside / "x.bin")
    (tier / "dir-link").symlink_to(outside, target_is_directory=True)
    (tier / "dangling").symlink_to(tmp_path / "missing")
    assert evict_page_cache(tier) == 1


@needs_fadvise
def test_only_files_modified_since_are_evicted(tmp_path: Path) -> None:
    (tmp_path / "filler.bin").write_bytes(b"f" * 4096)
    os.utime(tmp_path / "filler.bin", (1000.0, 1000.0))
    (tmp_path / "entry.bin").write_bytes(b"e" * 4096)
    assert evict_page_cache(tmp_path, modified_since=2000.0) == 1
    assert evict_page_cache(tmp_path) == 2


@needs_fadvise
@pytest.mark.skipif(os.geteuid() == 0, reason="root opens any file")
def test_a_file_it_cannot_open_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "readable.bin").write_bytes(b"r" * 4096)
    locked = tmp_path / "locked.bin"
    locked.write_bytes(b"l" * 4096)
    locked.chmod(0)
    try:
        assert evict_page_cache(tmp_path) == 1
    finally:
        locked.chmod(0o600)


def test_a_missing_directory_evicts_nothing(tmp_path: Path) -> None:
    assert evict_page_cache(tmp_path / "missing") == 0


def test_without_posix_fadvise_nothing_is_evicted_and_the_state_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.bin").write_bytes(b"a" * 4096)
    monkeypatch.setattr(page_cache, "CAN_EVICT", False)
    assert evict_page_cache(tmp_path) == 0
    assert page_cache_state(0) == "not evicted (no os.posix_fadvise here)"
