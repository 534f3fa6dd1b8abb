"""The benchmark's disk tier starts full, and a cold start moves it to a new generation."""

from __future__ import annotations

from pathlib import Path

from benchmarks.disk_fill import fill_disk, forget_disk
from kvmux.stores import DiskStore
from kvmux.tier.scheduler.generation import decode_record

ENTRY = 100 * 2**10


def test_fill_reaches_the_capacity_once(tmp_path: Path) -> None:
    assert fill_disk(tmp_path / "disk", ENTRY, "1MiB") == 10
    store = DiskStore(tmp_path / "disk", 2**20)
    assert store.used_bytes() == 10 * ENTRY
    assert fill_disk(tmp_path / "disk", ENTRY, "1MiB") == 0  # already full: nothing added


def test_forgetting_keeps_the_files_under_a_new_generation(tmp_path: Path) -> None:
    fill_disk(tmp_path / "disk", ENTRY, "1MiB")
    first = forget_disk(tmp_path / "disk", "1MiB")
    second = forget_disk(tmp_path / "disk", "1MiB")
    store = DiskStore(tmp_path / "disk", 2**20)
    assert first != second and decode_record(store.read_generation(), None) == second
    assert store.used_bytes() == 10 * ENTRY
