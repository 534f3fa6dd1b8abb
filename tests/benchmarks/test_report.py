"""results.md: every list of flat rows becomes a table, samples of a figure in one cell."""

from __future__ import annotations

from pathlib import Path

from benchmarks.report import write_report


def test_rows_with_samples_are_a_table_with_the_samples_in_one_cell(tmp_path: Path) -> None:
    rows = [
        {"config": "kvmux-memory", "ttft_warm_s": 0.2, "ttft_warm_samples_s": [0.3, 0.1, 0.2]},
        {"config": "none", "ttft_warm_s": 1.5, "ttft_warm_samples_s": [1.5]},
    ]
    write_report({"machine": {"cpu": "x"}, "long_prompts": rows}, tmp_path)
    report = (tmp_path / "results.md").read_text()
    assert "## long_prompts" in report
    assert "| kvmux-memory | 0.2 | 0.3, 0.1, 0.2 |" in report


def test_rows_holding_nested_data_are_left_to_results_json(tmp_path: Path) -> None:
    rows = [{"config": "a", "phases": {"local": [1.0]}}]
    write_report({"machine": {"cpu": "x"}, "nested": rows}, tmp_path)
    assert "## nested" not in (tmp_path / "results.md").read_text()


def test_the_run_settings_say_how_engines_redis_and_disk_ran(tmp_path: Path) -> None:
    results = {
        "machine": {"cpu": "x"},
        "allocator": "tcmalloc (/usr/lib/libtcmalloc_minimal.so.4)",
        "redis": {"maxmemory": 4 * 10**9, "filler_entries": 1890},
        "disk": {"capacity": "4GiB", "filler_entries": 2048},
        "disk_writes": "direct (free page reporting)",
    }
    write_report(results, tmp_path)
    report = (tmp_path / "results.md").read_text()
    assert "| allocator | tcmalloc (/usr/lib/libtcmalloc_minimal.so.4) |" in report
    assert "| redis tier | full, evicting (1890 filler entries) |" in report
    disk = "| disk tier | 4GiB, one directory, full from the start (2048 filler entries) |"
    assert disk in report
    assert "| disk tier writes | direct (free page reporting) |" in report
    write_report({"machine": {"cpu": "x"}}, tmp_path)  # a run from before they were recorded
    old = (tmp_path / "results.md").read_text()
    assert "| redis tier | not recorded (empty at start) |" in old
    assert "| disk tier writes | not recorded (page cache) |" in old
