"""The GPU check's benchmark: recompute, memory hit and disk hit on a Llama-sized model.

``python -m benchmarks.gpu [--lengths 4096,16384] [--work DIR]`` builds a
random-weight Llama of Llama 3.2 1B's shape, and for each prompt length measures the
time to first token (TTFT) computed without any connector, loaded from a kvmux memory
tier in the same engine (vLLM's prefix cache reset in between), and loaded from a disk
tier after an engine restart (MuxConnector over memory and disk): first with the files
the first engine wrote evicted from the page cache, then, in one more restart, with the
page cache warm. It prints one table row per length, with the speed-ups over recompute.
Written for a CUDA machine (run by ``scripts/gpu_check.sh``); it runs on the CPU too,
slowly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from benchmarks.e2e import Runner, long_prompts
from benchmarks.profiles import FULL
from kvmux.testing.models import build_random_llama

__all__ = ["format_table", "main", "measure"]

MODEL_SIZE = "llama-1b"


def measure(lengths: tuple[int, ...], work: Path) -> list[dict[str, Any]]:
    """One row per prompt length: TTFT computed, from memory and from disk, in seconds."""
    plan = dataclasses.replace(FULL, model_size=MODEL_SIZE, lengths=lengths)
    model = build_random_llama(work / "model" / MODEL_SIZE, size=MODEL_SIZE, dtype=plan.dtype)
    runner = Runner(plan, model, work / "e2e", None, {})
    recompute = {row["prompt_tokens"]: row for row in long_prompts(runner, "none")}
    tiers = {row["prompt_tokens"]: row for row in long_prompts(runner, "kvmux-mux-first")}
    rows = []
    for length in lengths:
        computed, loaded = recompute[length], tiers[length]
        rows.append(
            {
                "prompt_tokens": length,
                "recompute_s": computed["ttft_cold_s"],
                "memory_hit_s": loaded["ttft_warm_s"],
                "memory_cached_tokens": loaded["warm_cached_tokens"],
                "disk_hit_s": loaded.get("ttft_restart_s"),
                "disk_cached_tokens": loaded.get("restart_cached_tokens"),
                "disk_page_cache": loaded.get("restart_page_cache"),
                "disk_page_cache_warm_s": loaded.get("ttft_restart_page_cache_warm_s"),
            }
        )
    return rows


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _speedup(base: float, seconds: float | None) -> str:
    return "-" if not seconds else f"{base / seconds:.1f}x"


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of TTFT per prompt length, with speed-ups over recompute."""
    lines = [
        "| prompt tokens | recompute ms | memory hit ms | disk hit ms "
        "| disk, page cache warm ms | memory speed-up | disk speed-up "
        "| cached tokens (memory / disk) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base = row["recompute_s"]
        lines.append(
            f"| {row['prompt_tokens']} | {_ms(base)} | {_ms(row['memory_hit_s'])} "
            f"| {_ms(row['disk_hit_s'])} | {_ms(row.get('disk_page_cache_warm_s'))} "
            f"| {_speedup(base, row['memory_hit_s'])} | {_speedup(base, row['disk_hit_s'])} "
            f"| {row['memory_cached_tokens']} / {row['disk_cached_tokens']} |"
        )
    states = sorted({str(row["disk_page_cache"]) for row in rows if row.get("disk_page_cache")})
    if states:
        lines += ["", f"disk hit: the tier's files {'; '.join(states)} before the restart"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure and print the table; the rows also go to ``<work>/gpu-bench.json``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu")
    parser.add_argument("--lengths", default="4096,16384", help="prompt lengths, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("bench-results/gpu"))
    args = parser.parse_args(argv)
    lengths = tuple(int(n) for n in args.lengths.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    rows = measure(lengths, args.work)
    (args.work / "gpu-bench.json").write_text(json.dumps(rows, indent=2))
    print(format_table(rows))


if __name__ == "__main__":
    main()
