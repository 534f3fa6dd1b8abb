"""The disk tier's writes follow the machine: around the page cache where free pages go back."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmux.tools.bench.host_memory import DISK_WRITES, disk_writes, reports_free_pages

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
    assert disk_writes("auto", tmp_path) == ("direct (auto: free page reporting)", True)


def test_without_such_a_balloon_the_disk_tier_writes_through_the_page_cache(
    tmp_path: Path,
) -> None:
    assert not reports_free_pages(tmp_path / "absent")
    assert not reports_free_pages(_balloon(tmp_path / "b", NO_REPORTING, "01"))
    assert disk_writes("auto", tmp_path / "b") == (
        "page cache (auto: no free page reporting)",
        False,
    )


@pytest.mark.parametrize(("choice", "direct"), [("direct", True), ("page-cache", False)])
def test_an_explicit_choice_wins_over_the_machine(
    choice: str, direct: bool, tmp_path: Path
) -> None:
    devices = _balloon(tmp_path, REPORTING if not direct else NO_REPORTING)
    text, chosen = disk_writes(choice, devices)
    assert chosen is direct and text.endswith("(asked)")


def test_an_unknown_choice_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="auto"):
        disk_writes("sometimes")
    assert DISK_WRITES == ("auto", "direct", "page-cache")
