"""How the benchmark's disk tier writes, and whether the machine hands free pages back."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.host_memory import DISK_WRITES, disk_writes, reports_free_pages

REPORTING = "0110010" + "0" * 25 + "1" + "0" * 95  # bit 5 (VIRTIO_BALLOON_F_REPORTING) set
NO_REPORTING = "0110000" + "0" * 25 + "1" + "0" * 95


def _balloon(root: Path, *features: str) -> Path:
    for i, bits in enumerate(features):
        device = root / f"virtio{i}"
        device.mkdir(parents=True)
        (device / "features").write_text(bits + "\n")
    return root


def test_a_balloon_taking_free_page_reports_is_found(tmp_path: Path) -> None:
    assert reports_free_pages(_balloon(tmp_path, NO_REPORTING, REPORTING))
    assert disk_writes("page-cache", tmp_path) == ("page cache (free page reporting)", False)


def test_without_such_a_balloon_none_is_reported(tmp_path: Path) -> None:
    assert not reports_free_pages(tmp_path / "absent")
    assert not reports_free_pages(_balloon(tmp_path / "b", NO_REPORTING, "01"))
    assert disk_writes("direct", tmp_path / "b") == ("direct (no free page reporting)", True)


@pytest.mark.parametrize(("choice", "direct"), [("direct", True), ("page-cache", False)])
def test_the_choice_alone_decides(choice: str, direct: bool, tmp_path: Path) -> None:
    for bits in (REPORTING, NO_REPORTING):
        devices = _balloon(tmp_path / bits, bits)
        text, chosen = disk_writes(choice, devices)
        assert chosen is direct and text.startswith(choice.replace("-", " "))


def test_an_unknown_choice_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="page-cache"):
        disk_writes("auto")
    assert DISK_WRITES == ("page-cache", "direct")
