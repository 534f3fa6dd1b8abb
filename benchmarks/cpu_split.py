"""Where the saving cost goes: CPU seconds by role while an engine saves.

``python -m benchmarks.cpu_split [--configs none,kvmux-mux-redis] [--batches 3]
[--allocator auto] [--empty-redis]``

One engine per configuration, in vLLM's default multi-process layout (the saving bar's),
takes the saving workload's batches (``noreuse_*`` of the full plan: 16 distinct
1024-token prompts, 32 tokens generated each), one after an unmeasured one, each followed
by a pause in which its background writes end. Around each batch and its pause the CPU
seconds of every role are taken (``kvmux.testing.cpu_times``): the forward pass (vLLM's
worker process), kvmux's helper threads, the engine core, the front end and the
benchmark's redis-server (full and evicting, as ``kvmux bench`` starts it, unless
``--empty-redis``). Prints the medians over the batches, and writes them as JSON
with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.allocator import ALLOCATORS, allocator_env
from benchmarks.configs import CONFIGS
from benchmarks.disk_fill import fill_disk
from benchmarks.e2e import Runner
from benchmarks.host_memory import DISK_WRITES
from benchmarks.host_memory import disk_writes as disk_writes_of
from benchmarks.profiles import ENTRY_BYTES, FULL, BenchPlan
from benchmarks.redis_proc import RedisProcess
from benchmarks.saving import saving_batch
from kvmux.testing.models import build_random_llama

__all__ = ["batch_steps", "main", "split_rows"]

PAUSE_S = 2.0  # after each batch: its background writes end within the measurement
DEFAULT_CONFIGS = ("none", "kvmux-memory", "kvmux-mux-first", "kvmux-mux-redis")
WARM_SEED = 900_000  # prompts distinct from every other workload's
SEED = 910_000


def _batch(runner: Runner, seed: int) -> dict[str, Any]:
    return saving_batch(runner, lambda i: seed + i)


def batch_steps(runner: Runner, batches: int, pids: list[int]) -> list[dict[str, Any]]:
    """An unmeasured batch, then ``batches`` batches each between two ``cpu_times``."""
    cpu = {"op": "cpu_times", "pids": pids}
    steps = [_batch(runner, WARM_SEED), {"op": "sleep", "seconds": PAUSE_S}]
    for index in range(batches):
        steps += [cpu, _batch(runner, SEED + 100 * index)]
        steps += [{"op": "sleep", "seconds": PAUSE_S}, cpu]
    return steps


def split_rows(config: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians over a run's batches: its seconds and each role's CPU seconds."""
    times = [s["seconds"] for s in steps if s["op"] == "cpu_times"]
    batches = [s["seconds"] for s in steps if s["op"] == "generate"][2:]  # warm-ups left out
    used: dict[str, list[float]] = {}
    for before, after in zip(times[::2], times[1::2], strict=True):
        for role in after:
            used.setdefault(role, []).append(after[role] - before.get(role, 0.0))
    row: dict[str, Any] = {"config": config, "batch_s": statistics.median(batches)}
    row["cpu_s"] = {role: round(statistics.median(v), 3) for role, v in sorted(used.items())}
    return row


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: a row per configuration, a column per role."""
    roles = sorted({role for row in rows for role in row["cpu_s"]})
    lines = ["| config | batch s | " + " | ".join(roles) + " |"]
    lines.append("|---|---|" + "---|" * len(roles))
    for row in rows:
        cells = [f"{row['cpu_s'].get(role, 0.0):.2f}" for role in roles]
        lines.append(f"| {row['config']} | {row['batch_s']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_split(
    configs: list[str],
    batches: int,
    workdir: Path,
    plan: BenchPlan = FULL,
    allocator: str = "auto",
    empty_redis: bool = False,
    disk_writes: str = "page-cache",
) -> list[dict[str, Any]]:
    """One engine per configuration through ``batch_steps``; a row per configuration."""
    _, extra_env = allocator_env(allocator)
    _, direct_writes = disk_writes_of(disk_writes)
    model_dir = workdir / f"model-{plan.model_size}-{plan.dtype}"
    model = build_random_llama(model_dir, plan.model_size, plan.dtype)
    rows = []
    with RedisProcess(workdir / "redis", plan.redis_maxmemory) as redis:
        assert redis.proc is not None
        if not empty_redis:
            redis.fill(ENTRY_BYTES)
        runner = Runner(plan, model, workdir / "e2e", redis.url, {}, extra_env, direct_writes)
        fill_disk(runner.disk_path, ENTRY_BYTES, plan.disk_capacity)
        for config in configs:
            steps = batch_steps(runner, batches, [redis.proc.pid])
            run = runner.run(
                config, steps, multiprocess=True, num_gpu_blocks_override=plan.engine_blocks * 4
            )
            rows.append(split_rows(config, run["steps"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--allocator", choices=ALLOCATORS, default="auto")
    parser.add_argument("--empty-redis", action="store_true", help="start redis-server empty")
    parser.add_argument("--disk-writes", choices=DISK_WRITES, default="page-cache")
    args = parser.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    accepted = [c for c in CONFIGS if c != "lmcache"]  # LMCache needs its own server
    if not configs or any(c not in accepted for c in configs):
        parser.error(f"--configs: comma-separated, of {', '.join(accepted)}")
    if args.batches < 1:
        parser.error("--batches: 1 or more")
    with tempfile.TemporaryDirectory(prefix="kvmux-cpu-") as tmp:
        workdir = args.workdir or Path(tmp)
        rows = run_split(
            configs,
            args.batches,
            workdir,
            allocator=args.allocator,
            empty_redis=args.empty_redis,
            disk_writes=args.disk_writes,
        )
    print(format_rows(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
