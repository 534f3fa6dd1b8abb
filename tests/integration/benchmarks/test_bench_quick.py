"""Smoke test: ``python -m benchmarks --quick`` on the tiny model writes every output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

CONFIGS = "none,kvmux-memory,kvmux-mux-redis,lmcache"  # the others: same harness, more engines
ROOT = Path(__file__).resolve().parents[3]  # the repository: benchmarks/ is not installed


def test_quick_bench_writes_results_tables_and_charts(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    argv = [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)]
    argv += [
        "--workdir",
        str(work),
        "--configs",
        CONFIGS,
        "--lmcache-python",
        str(tmp_path / "none"),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1500, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert {"machine", "stores", "long_prompts", "reuse", "no_reuse", "overhead", "bars"} <= set(
        results
    )
    assert results["allocator"].startswith(("tcmalloc", "system"))  # every engine's, recorded
    assert results["redis"]["filler_entries"] > 0  # the Redis tier starts full, as in service
    assert results["disk_writes"].startswith("page cache")  # the default
    assert results["disk"]["filler_entries"] > 0  # the disk tier starts full
    assert (out / "results.md").exists() and (out / "stores.png").exists()
    errors = [
        r for key in ("long_prompts", "reuse", "no_reuse") for r in results[key] if "error" in r
    ]
    assert errors == []
    assert results["peer_errors"][0]["config"] == "lmcache"  # reported, not dropped
    memory = next(r for r in results["long_prompts"] if r["config"] == "kvmux-memory")
    assert memory["warm_cached_tokens"] > 0
    restart = next(r for r in results["long_prompts"] if r["config"] == "kvmux-mux-redis")
    assert restart["restart_cached_tokens"] > 0 and "redis" in restart["restart_source"]
    assert "MET" in proc.stdout or "SHORT" in proc.stdout
    last = results["multi_turn"][-1]  # replies saved too: the last turn finds more
    assert last["cached_with_replies"] > last["cached_prompt_only"] > 0
