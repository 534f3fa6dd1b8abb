"""Workload (a)'s warm TTFT and the overhead rows: medians of repeated samples."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks import e2e
from benchmarks.profiles import QUICK
from kvmux.tools.page_cache import page_cache_state


class FakeRunner:
    """Answers every generate step with the next of ``seconds``, in order."""

    def __init__(self, seconds: list[float], **plan: Any):
        self.plan = replace(QUICK, **plan)
        self.work = Path("/nonexistent")
        self.model = Path("/nonexistent/model")
        self.seconds = iter(seconds)
        self.jobs: list[list[dict[str, Any]]] = []
        self.extra_env = {"LD_PRELOAD": "/lib/libtcmalloc_minimal.so.4"}  # the run's allocator

    def tokens(self, seed: int, count: int) -> list[int]:
        return [seed] * count

    def run(self, config: str, steps: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        self.jobs.append(steps)
        done = [{"op": "generate", "seconds": 0.0, "num_cached_tokens": [0], "stats": {}}]
        hits = 0.0  # the memory tier's counter: every request after the first hits
        for step in steps:
            if step["op"] == "generate":
                cached = 896 if len(done) > 1 else 0
                hits += cached
                stats = {"memory": {"hit_tokens": hits}}
                done.append(
                    {
                        "op": "generate",
                        "seconds": next(self.seconds),
                        "num_cached_tokens": [cached],
                        "stats": stats,
                    }
                )
        return {"steps": done}


def test_warm_ttft_is_the_median_of_the_repeats() -> None:
    runner = FakeRunner([5.0, 0.3, 0.1, 0.2, 6.0, 0.9, 0.5, 0.4], lengths=(1024, 2048))
    runner.plan = replace(runner.plan, warm_repeats=3)
    rows = e2e.long_prompts(runner, "kvmux-memory")  # type: ignore[arg-type]
    generates = [s for s in runner.jobs[0] if s["op"] == "generate"]
    assert len(generates) == 2 * (1 + 3)  # per prompt: cold, then three warm
    resets = [s for s in runner.jobs[0] if s["op"] == "reset_prefix_cache"]
    assert len(resets) == 2 * 3  # before each warm request
    assert [r["ttft_cold_s"] for r in rows] == [5.0, 6.0]
    assert [r["ttft_warm_s"] for r in rows] == [0.2, 0.5]
    assert rows[0]["ttft_warm_samples_s"] == [0.3, 0.1, 0.2]
    assert rows[0]["warm_source"] == "memory:896"  # the first warm request's hits


def test_the_prefix_cache_is_not_reset_between_its_own_warm_requests() -> None:
    runner = FakeRunner([1.0, 0.1, 0.1], lengths=(1024,), warm_repeats=2)
    e2e.long_prompts(runner, "vllm-prefix-cache")  # type: ignore[arg-type]
    assert not [s for s in runner.jobs[0] if s["op"] == "reset_prefix_cache"]


def test_a_disk_restart_reads_evicted_files_then_a_warm_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = FakeRunner([5.0, 0.2, 0.4, 0.3], lengths=(1024,), warm_repeats=1)
    runner.disk_path = tmp_path / "disk"  # type: ignore[attr-defined]
    evicted: list[tuple[Path, float | None, int]] = []

    def fake_evict(directory: Path, modified_since: float | None = None) -> int:
        evicted.append((directory, modified_since, len(runner.jobs)))
        return 7

    monkeypatch.setattr(e2e, "evict_page_cache", fake_evict)
    monkeypatch.setattr(e2e, "forget_disk", lambda path, capacity: b"")
    (row,) = e2e.long_prompts(runner, "kvmux-mux-first")  # type: ignore[arg-type]
    assert len(runner.jobs) == 3  # the first engine, a cold restart, a warm one
    ((directory, since, jobs_before),) = evicted
    assert directory == tmp_path / "disk" and since is not None
    assert jobs_before == 1  # after the writing engine, before the cold restart
    assert row["ttft_restart_s"] == 0.4
    assert row["ttft_restart_page_cache_warm_s"] == 0.3
    assert row["restart_page_cache"] == page_cache_state(7)  # "not evicted" without fadvise


def test_a_restart_from_redis_evicts_nothing_and_runs_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = FakeRunner([5.0, 0.2, 0.4], lengths=(1024,), warm_repeats=1)
    runner.disk_path = Path("/nonexistent/disk")  # type: ignore[attr-defined]
    monkeypatch.setattr(e2e, "evict_page_cache", lambda *_: pytest.fail("evicted"))
    monkeypatch.setattr(e2e, "forget_disk", lambda path, capacity: b"")
    (row,) = e2e.long_prompts(runner, "kvmux-mux-redis")  # type: ignore[arg-type]
    assert len(runner.jobs) == 2
    assert "restart_page_cache" not in row and "ttft_restart_page_cache_warm_s" not in row


def _hook_times(added_us: float, children_us: float, steps: int = 10) -> dict[str, Any]:
    seconds = {"scheduler/top/build_connector_meta/calls": steps}
    for side in ("scheduler", "worker"):
        seconds[f"{side}/children"] = children_us * steps / 1e6
        seconds[f"{side}/top"] = (children_us + added_us) * steps / 1e6
    return {"op": "hook_times", "seconds": seconds}


def test_overhead_rows_are_medians_over_batches_and_alternating_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs: list[dict[str, Any]] = []
    mux_added = itertools.cycle([10.0, 11.0, 90.0, 12.0])  # one stray pause
    multi_added = itertools.cycle([20.0])

    def fake_job(job: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        jobs.append(job)
        assert env["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4"  # every engine's allocator
        added = mux_added if job["kv"]["kv_connector"] == "MuxConnector" else multi_added
        chunks = [s for s in job["steps"] if s["op"] == "hook_times"]
        assert all(s["reset"] for s in chunks)
        return {"steps": [_hook_times(next(added), 100.0) for _ in chunks]}

    monkeypatch.setattr(e2e, "run_engine_job", fake_job)
    runner = FakeRunner([], overhead_children=(2,), overhead_rounds=2)
    rows = e2e.mux_overhead(runner, lambda _: None)  # type: ignore[arg-type]
    kinds = [job["kv"]["kv_connector"] for job in jobs]
    assert kinds == ["MuxConnector", "MultiConnector", "MultiConnector", "MuxConnector"]
    mux, multi = rows
    assert (mux["connector"], mux["children"], mux["samples"]) == ("MuxConnector", 2, 8)
    assert mux["scheduler_added_us_per_step"] == pytest.approx(11.5)  # the pause left out
    assert multi["worker_added_us_per_step"] == pytest.approx(20.0)
    assert mux["scheduler_added_ratio"] == pytest.approx(0.115)
    assert mux["steps"] == 80
