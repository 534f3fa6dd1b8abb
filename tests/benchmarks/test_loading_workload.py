"""Workload (d), decoding while long prompts load: its figures, its bar and its report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.bars import evaluate_bars
from benchmarks.e2e import LoadingShape, itl_row
from benchmarks.report import write_report

SHAPE = LoadingShape(decoders=2, loaders=2, long_tokens=256, rounds=1)


def phase(step: float, stall: float, first_tokens: list[float]) -> dict[str, Any]:
    """Two decoding requests stepping every ``step`` s, one step ``stall`` s long at 0.5 s."""
    times, now = [], 0.0
    while now < 1.0:
        now += stall if 0.5 <= now < 0.5 + step else step
        times.append(now)
    return {
        "token_times": [times, times],
        "arrivals": [0.2, 0.4],
        "first_tokens": first_tokens,
        "cached_tokens": [256, 256],
    }


def test_itl_row_compares_the_load_window_of_both_phases() -> None:
    result = {
        "phases": {
            "local": [phase(0.02, 0.02, [0.22, 0.42])],
            "tier": [phase(0.02, 0.05, [0.3, 0.6])],
        }
    }
    row = itl_row("disk", "auto", SHAPE, result)
    assert (row["config"], row["loads"], row["loaded_tokens"]) == ("disk (async)", "async", 512)
    assert row["itl_p50_ms_no_load"] == pytest.approx(20)
    assert row["itl_p99_ms_loading"] == pytest.approx(50)  # the stall falls in the window
    assert row["itl_p99_ratio"] == row["itl_p99_ratio_median_round"] == pytest.approx(2.5)
    assert row["ttft_p50_ms_loading"] == pytest.approx(100)
    assert row["samples_no_load"] < row["samples_loading"]  # each phase's own window
    assert itl_row("disk", "never", SHAPE, result)["loads"] == "sync"


def test_the_bar_is_met_per_tier_and_missing_figures_are_shown() -> None:
    rows = [
        {"config": "disk (async)", "tier": "disk", "loads": "async", "prompt_tokens": 4097,
         "itl_p99_ratio": 1.1},
        {"config": "disk (sync)", "tier": "disk", "loads": "sync", "prompt_tokens": 4097,
         "itl_p99_ratio": 9.0},
    ]  # fmt: skip
    bars = {b["bar"]: b for b in evaluate_bars({"async_loads": rows})}
    disk = bars["decode ITL p99 while 4097-token prompts load from disk / nothing loading"]
    assert (disk["measured"], disk["met"]) == (1.1, True)
    redis = bars["decode ITL p99 while long prompts load from redis / nothing loading"]
    assert (redis["measured"], redis["met"], redis["note"]) == (None, False, "not measured")


def test_the_report_draws_the_loading_rows(tmp_path: Path) -> None:
    result = {
        "phases": {
            "local": [phase(0.02, 0.02, [0.22, 0.42])],
            "tier": [phase(0.02, 0.05, [0.3, 0.6])],
        }
    }
    write_report({"async_loads": [itl_row("disk", "auto", SHAPE, result)]}, tmp_path)
    assert "## async_loads" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "itl.png").exists()
