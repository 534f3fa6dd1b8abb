"""The GPU check's benchmark table (the measurement itself needs a Llama-sized model)."""

from __future__ import annotations

from benchmarks.gpu import format_table


def test_the_table_shows_milliseconds_and_speedups_over_recompute() -> None:
    rows = [
        {
            "prompt_tokens": 4096,
            "recompute_s": 0.8,
            "memory_hit_s": 0.1,
            "memory_cached_tokens": 4032,
            "disk_hit_s": 0.2,
            "disk_cached_tokens": 4032,
            "disk_page_cache": "evicted (40 files, posix_fadvise DONTNEED)",
            "disk_page_cache_warm_s": 0.125,
        },
        {
            "prompt_tokens": 16384,
            "recompute_s": 3.0,
            "memory_hit_s": 0.3,
            "memory_cached_tokens": 16320,
            "disk_hit_s": None,
            "disk_cached_tokens": None,
            "disk_page_cache": None,
            "disk_page_cache_warm_s": None,
        },
    ]
    lines = format_table(rows).splitlines()
    assert "| disk hit ms | disk, page cache warm ms |" in lines[0]
    assert lines[2] == "| 4096 | 800.0 | 100.0 | 200.0 | 125.0 | 8.0x | 4.0x | 4032 / 4032 |"
    assert lines[3] == "| 16384 | 3000.0 | 300.0 | - | - | 10.0x | - | 16320 / None |"
    assert lines[5] == (
        "disk hit: the tier's files evicted (40 files, posix_fadvise DONTNEED) before the restart"
    )
