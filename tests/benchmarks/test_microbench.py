"""The store microbenchmark on a few small entries, and the report written from it."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("redis")
pytest.importorskip("matplotlib")
if shutil.which("redis-server") is None:
    pytest.skip("redis-server is not on PATH", allow_module_level=True)

from benchmarks.microbench import REPEATS, WARM_DISK, _Bench, run_store_bench
from benchmarks.report import machine_info, write_report
from kvmux.tools.page_cache import CAN_EVICT
from kvmux.tools.tier_bench import Timed


def test_store_bench_and_report(tmp_path: Path) -> None:
    stores = run_store_bench(4, 64 * 1024, tmp_path / "work", progress=False)
    assert stores["config"]["entries"] == 4
    assert stores["config"]["repeats"] == REPEATS
    assert "take turns" in stores["config"]["order"]
    assert stores["disk_page_cache"]["reads"] in ("evicted", "not evicted")
    pairs = [(row["tier"], row["op"]) for row in stores["rows"]]
    expected = [(t, op) for t in ("memory", "disk", "redis") for op in ("put", "get")]
    expected.insert(4, (WARM_DISK, "get"))  # beside the cold disk get
    assert pairs == expected
    cold, warm = stores["rows"][3:5]
    assert cold["page_cache"] == stores["disk_page_cache"]["reads"]
    assert warm["page_cache"] == "warm"
    if CAN_EVICT:
        assert "evicted (" in stores["disk_page_cache"]["cold"]
    for row in stores["rows"]:
        for side in ("kvmux", "limit"):
            assert row[f"{side}_gbps"] > 0
            assert 0 < row[f"{side}_lat_p50_ms"] <= row[f"{side}_lat_p90_ms"]
        assert row["ratio"] > 0
    json.dumps(stores)

    extra = [{"config": "none", "ttft_ms": 1.5}, {"config": "kvmux", "ttft_ms": 0.5}]
    out = tmp_path / "out"
    write_report({"machine": machine_info(), "stores": stores, "serving": extra}, out)
    assert json.loads((out / "results.json").read_text())["stores"]["rows"]
    markdown = (out / "results.md").read_text()
    assert "## Machine" in markdown and "## Store microbenchmarks" in markdown
    assert "## serving" in markdown and "| kvmux | 0.5 |" in markdown
    assert (out / "stores.png").read_bytes().startswith(b"\x89PNG")
    assert "| tier | op | page cache |" in markdown and f"| {WARM_DISK} | get | warm |" in markdown


def test_operations_take_turns_round_by_round() -> None:
    bench = _Bench(2, 1024, progress=False)
    log: list[str] = []
    ops = [
        Timed([[0], [1]], lambda u, n=name: log.append(f"{n}{u[0]}"), partial(log.append, name))
        for name in ("put", "limit")
    ]
    summaries = bench.measure("turns", *ops)
    assert len(summaries) == 2
    assert log == ["put", "put0", "put1", "limit", "limit0", "limit1"] * REPEATS


def test_report_without_sections(tmp_path: Path) -> None:
    write_report({"notes": "nothing measured"}, tmp_path)
    assert "## Machine" in (tmp_path / "results.md").read_text()
    assert not (tmp_path / "stores.png").exists()
