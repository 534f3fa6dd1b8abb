"""docs/benchmarks.md from full runs: runs named by machine and settings, history in JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compose_docs


def _run(folder: Path, measured: float, cpu: str = "Intel Xeon") -> Path:
    data: dict[str, Any] = {
        "machine": {"cpu": cpu},
        "allocator": "tcmalloc (libtcmalloc_minimal.so.4)",
        "redis": {"filler_entries": 10},
        "disk": {"filler_entries": 5},
        "disk_writes": "page cache",
        "seconds": 100.0,
        "bars": [
            {"bar": "saving cost over 16 pairs", "measured": measured, "limit": 0.05, "met": True}
        ],
        "long_prompts": [{"config": "none", "prompt_tokens": 1024, "ttft_warm_s": 0.1}],
        **{key: [] for key in ("no_reuse", "warm_ttft", "overhead", "async_loads")},
    }
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(data))
    (folder / "results.md").write_text(
        "# kvmux benchmark results\n\n## Machine\n\n| machine row |\n\n"
        "## no_reuse\n\n| saving round row |\n\n## overhead\n\n| overhead row |\n\n"
        "## Charts\n\n![c](stores.png)\n"
    )
    return folder


def test_the_page_carries_no_run_numbers_or_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "docs"
    (docs / "bench-results").mkdir(parents=True)
    old = json.loads((_run(tmp_path / "old", 0.01) / "results.json").read_text())
    old.update(runs_commit="0ldc0mm1t", earlier_runs=[{"run": 6, "commit": "e4r1i3r", "bars": []}])
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "head.md").write_text("# Benchmarks\n")
    (tmp_path / "short.md").write_text("## What falls short, and why\n")
    runs = [
        f"{_run(tmp_path / name, m)}:{c}"
        for name, m, c in (("a", 0.02, "aaa1111"), ("b", 0.03, "bbb2222"), ("c", 0.04, "ccc3333"))
    ]
    paths = ["head.md", "short.md", "old.json"]
    monkeypatch.setattr(
        "sys.argv", ["compose", *(str(tmp_path / p) for p in paths), str(docs), *runs]
    )
    compose_docs.main()
    page = (docs / "benchmarks.md").read_text()
    for commit in ("0ldc0mm1t", "e4r1i3r", "aaa1111", "bbb2222", "ccc3333"):
        assert commit not in page
    assert re.search(r"\bruns? \d", page) is None
    heads = [f"Xeon, tcmalloc, Redis full, disk full ({p})" for p in ("3rd latest", "2nd latest")]
    assert all(head in page for head in heads) and "disk full (latest)" in page  # alike runs
    assert "0.010" not in page and "earlier runs" not in page  # earlier runs: results.json only
    assert "0.020" in page and "0.030" in page and "0.040" in page
    assert "overhead row" in page and "saving round row" not in page  # per-round tables left off
    assert "machine row" not in page and "bench-results/results.md" in page
    assert "](bench-results/stores.png)" in page
    result = json.loads((docs / "bench-results" / "results.json").read_text())
    commits = ["e4r1i3r", "0ldc0mm1t", "aaa1111", "bbb2222", "ccc3333"]
    assert result["runs_commits"] == commits  # history
    assert [e["run"] for e in result["earlier_runs"]] == [6, 7, 8, 9]
