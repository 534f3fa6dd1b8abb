"""``python -m benchmarks``: every measurement of one run, then the report and the bars."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.allocator import allocator_env
from benchmarks.bars import evaluate_bars
from benchmarks.configs import CONFIGS
from benchmarks.disk_fill import fill_disk
from benchmarks.e2e import Runner, async_loads, long_prompts, mux_overhead, reuse_workload
from benchmarks.host_memory import disk_writes as disk_writes_of
from benchmarks.microbench import run_store_bench
from benchmarks.multi_turn import multi_turn
from benchmarks.peers import LMCacheServer
from benchmarks.profiles import ENTRY_BYTES, FULL, QUICK, BenchPlan
from benchmarks.redis_proc import RedisProcess
from benchmarks.report import machine_info, write_report
from benchmarks.saving import LAYOUTS, SAVING_CONFIGS, saving_rounds
from benchmarks.warm import WARM_CONFIGS, warm_rounds
from kvmux.testing.models import build_random_llama

__all__ = ["run_bench"]


def _guarded(label: str, fn: Callable[[], Any]) -> Any:
    """Run one measurement; a failure becomes a reported error, not a crash."""
    try:
        return fn()
    except Exception as exc:
        return {
            "config": label,
            "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:800] if str(exc) else ''}",
            "trace": traceback.format_exc()[-2000:],
        }


def _rows(value: Any) -> list[dict[str, Any]]:
    return value if isinstance(value, list) else [value]


def _workload(runner: Runner, name: str, config: str) -> Callable[[], Any]:
    """End-to-end workload ``name`` of ``config``, ready to call."""
    return partial({"long_prompts": long_prompts, "reuse": reuse_workload}[name], runner, config)


def run_bench(
    out: Path,
    quick: bool,
    workdir: Path,
    lmcache_python: Path | None,
    configs: tuple[str, ...] = CONFIGS,
    allocator: str = "auto",
    empty_redis: bool = False,
    disk_writes: str = "page-cache",
) -> dict[str, Any]:
    """Run the benchmark; returns the results written to ``out``.

    ``allocator`` (``bench/allocator.py``): the memory allocator of every engine.
    ``disk_writes`` (``bench/host_memory.py``): how the disk tiers write: ``page-cache``
    (the default) or ``direct`` (around it, ``direct_writes``).
    ``empty_redis``: the Redis tier starts empty instead of full (``RedisProcess.fill``).
    """
    plan: BenchPlan = QUICK if quick else FULL
    started = time.time()
    allocator_name, extra_env = allocator_env(allocator)  # refused before anything runs
    writes_name, direct_writes = disk_writes_of(disk_writes)
    results: dict[str, Any] = {"machine": machine_info(), "plan": plan.__dict__, "quick": quick}
    results["allocator"] = allocator_name
    results["disk_writes"] = writes_name
    results["stores"] = run_store_bench(plan.store_entries, ENTRY_BYTES, workdir / "stores")
    model = build_random_llama(
        workdir / f"model-{plan.model_size}-{plan.dtype}", plan.model_size, plan.dtype
    )
    redis = RedisProcess(workdir / "redis", plan.redis_maxmemory).start()
    try:
        filler = 0 if empty_redis else redis.fill(ENTRY_BYTES)
    except BaseException:
        redis.stop()
        raise
    results["redis"] = {"maxmemory": redis.maxmemory, "filler_entries": filler}
    lmcache = None
    pythons: dict[str, str] = {}
    if "lmcache" in configs:
        if lmcache_python is None or not lmcache_python.exists():
            results["peer_errors"] = [
                {
                    "config": "lmcache",
                    "error": "LMCache venv not found: run scripts/setup-lmcache.sh",
                }
            ]
            configs = tuple(c for c in configs if c != "lmcache")
        else:
            lmcache = _guarded(
                "lmcache", lambda: LMCacheServer(lmcache_python, workdir / "lmcache").start()
            )
            if isinstance(lmcache, dict):
                results["peer_errors"] = [lmcache]
                lmcache, configs = None, tuple(c for c in configs if c != "lmcache")
            else:
                pythons["lmcache"] = str(lmcache_python)
    runner = Runner(plan, model, workdir / "e2e", redis.url, pythons, extra_env, direct_writes)
    try:
        filled = fill_disk(runner.disk_path, ENTRY_BYTES, plan.disk_capacity)
        results["disk"] = {"capacity": plan.disk_capacity, "filler_entries": filled}
        work = [(name, c) for c in configs for name in ("long_prompts", "reuse")]
        for name, config in tqdm(work, desc="end-to-end", unit="run"):
            call = _workload(runner, name, config)
            results.setdefault(name, []).extend(_rows(_guarded(config, call)))
        if set(WARM_CONFIGS) <= set(configs):
            warm = partial(warm_rounds, runner, plan.warm_rounds)
            results["warm_ttft"] = _rows(_guarded("warm_ttft", warm))
        if set(SAVING_CONFIGS) <= set(configs):
            for layout in LAYOUTS[:1] if quick else LAYOUTS:  # in-process: for comparison
                sessions = plan.saving_sessions if layout == LAYOUTS[0] else 1
                saving = partial(
                    saving_rounds, runner, layout, plan.saving_rounds, sessions=sessions
                )
                rows = _rows(_guarded(f"no_reuse {layout}", saving))
                results.setdefault("no_reuse", []).extend(rows)
        results["overhead"] = _rows(_guarded("overhead", lambda: mux_overhead(runner, tqdm.write)))
        loading = _guarded("async_loads", lambda: async_loads(runner, tqdm.write, quick))
        results["async_loads"] = _rows(loading)
        if "kvmux-memory" in configs:
            chats = _guarded("multi_turn", lambda: multi_turn(runner))
            results["multi_turn"] = _rows(chats)
    finally:
        redis.stop()
        if lmcache is not None:
            lmcache.stop()
    results["bars"] = evaluate_bars(results)
    results["seconds"] = time.time() - started
    write_report(results, out)
    return results
