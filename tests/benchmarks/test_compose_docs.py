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
        "# kvmux benchmark results\n\n## Machine\n\n![c](stores.png)\n"
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
        for name, m, c in (("a", 0.02, "aaa1111"), ("b", 0.03, "bbb2222"))
    ]
    paths = ["head.md", "short.md", "old.json"]
    monkeypatch.setattr(
        "sys.argv", ["compose", *(str(tmp_path / p) for p in paths), str(docs), *runs]
    )
    compose_docs.main()
    page = (docs / "benchmarks.md").read_text()
    for commit in ("0ldc0mm1t", "e4r1i3r", "aaa1111", "bbb2222"):
        assert commit not in page
    assert re.search(r"\bruns? \d", page) is None
    assert "Xeon, tcmalloc, Redis full, disk full (a)" in page  # two alike runs, lettered
    assert "2 earlier runs: lowest to highest" in page and "0.010 to 0.010" in page
    result = json.loads((docs / "bench-results" / "results.json").read_text())
    assert result["runs_commits"] == ["e4r1i3r", "0ldc0mm1t", "aaa1111", "bbb2222"]  # history
    assert [e["run"] for e in result["earlier_runs"]] == [6, 7, 8]
