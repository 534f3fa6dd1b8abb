"""benchmarks.shards: a tiny run of both layouts at TP=1 and TP=2 over a disk tier."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.shards import main


def test_a_tiny_run_reports_both_layouts_and_their_ratios(tmp_path: Path) -> None:
    out = tmp_path / "shards.json"
    argv = ["--blocks", "4", "--rounds", "1", "--stores", "disk", "--layers", "2", "--json"]
    assert main([*argv, str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {(r["tp"], r["layout"]): r for r in data["rows"]}
    assert rows[(1, "per-head")]["entries"] == 4 * 8  # one per head and block
    assert rows[(2, "per-rank")]["entries"] == 4 * 2
    for ratio in data["ratios"]:  # the same bytes, give or take the headers
        assert 0.99 < ratio["bytes"] < 1.05
