"""End-to-end workloads in vLLM: long prompts, multi-turn and RAG reuse, overhead, and
decoding latency while long prompts load from a slow tier (no reuse: ``saving.py``)."""

from __future__ import annotations

import itertools
import math
import random
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.configs import DISK_CONFIGS, disk_tier, kv_config
from benchmarks.disk_fill import forget_disk
from benchmarks.profiles import BenchPlan
from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import MODEL_SIZES
from kvmux.tools.page_cache import evict_page_cache, page_cache_state

__all__ = [
    "LoadingShape",
    "Runner",
    "async_loads",
    "itl_row",
    "loads_while_decoding",
    "long_prompts",
    "mux_overhead",
    "restart_files",
    "reuse_workload",
]

TIERS = ("memory", "disk", "redis")

# every configuration alike: 4 GiB of KV cache, and one core kept for the engine's other
# processes (vLLM's default without a connector; with one it keeps a second, which kvmux
# does not need: see benchmarks.reserved_cpu)
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}


def _tokens(seed: int, count: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(count)]


def _gen(prompts: list[list[int]], max_tokens: int = 1) -> dict[str, Any]:
    return {"op": "generate", "prompts": prompts, "max_tokens": max_tokens}


def _generates(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in run["steps"] if s["op"] == "generate"]


class Runner:
    """Runs engine jobs for one plan, model and work directory; peers may use other Pythons."""

    def __init__(
        self,
        plan: BenchPlan,
        model: Path,
        work: Path,
        redis_url: str | None,
        pythons: dict[str, str],
        extra_env: dict[str, str] | None = None,
        direct_writes: bool = False,
    ):
        self.plan = plan
        self.model = model
        self.work = work
        self.redis_url = redis_url
        self.pythons = pythons  # configuration -> python executable (LMCache's own venv)
        # set for every engine the run starts: its allocator (bench/allocator.py)
        self.extra_env = dict(extra_env or {})
        self.direct_writes = direct_writes  # the disk tiers' (bench/host_memory.py)
        self.disk_path = work / "disk"  # the one disk tier every engine uses (bench/disk_fill.py)
        self.vocab = MODEL_SIZES[plan.model_size].vocab_size

    @property
    def engine_env(self) -> dict[str, str]:
        """The environment of the run's engines: ``ENGINE_ENV`` and ``extra_env``."""
        return {**ENGINE_ENV, **self.extra_env}

    def tokens(self, seed: int, count: int) -> list[int]:
        """Deterministic random prompt tokens."""
        return _tokens(seed, count, self.vocab)

    def run(
        self,
        config: str,
        steps: list[dict[str, Any]],
        fresh: bool = True,
        multiprocess: bool = False,
        **engine: Any,
    ) -> dict[str, Any]:
        """One engine of ``config`` through ``steps``; ``fresh`` empties its local tiers first.

        ``multiprocess`` runs vLLM's default layout (engine core and worker in processes of
        their own; the job's steps then report no tier counters).
        """
        work = self.work / config
        if fresh:
            shutil.rmtree(work, ignore_errors=True)
            if config in DISK_CONFIGS:
                forget_disk(self.disk_path, self.plan.disk_capacity)
        work.mkdir(parents=True, exist_ok=True)
        longest = max(
            (*self.plan.lengths, self.plan.system_tokens + self.plan.turns * self.plan.user_tokens)
        )
        settings = {
            "dtype": self.plan.dtype,
            "max_model_len": longest + 256,
            "max_num_batched_tokens": longest
            + 256,  # no chunked prefill: ExampleConnector needs it
            "enable_prefix_caching": config == "vllm-prefix-cache",
            **engine,
        }
        job = {
            "model": str(self.model),
            "engine": settings,
            "kv": kv_config(
                config,
                work,
                self.redis_url,
                self.direct_writes,
                self.disk_path,
                self.plan.disk_capacity,
            ),
            "steps": [_gen([self.tokens(1, 256)]), *steps],  # warm-up, not measured
            "multiprocess": multiprocess,
        }
        return run_engine_job(
            job, env=self.engine_env, python=self.pythons.get(config), timeout=3600
        )


def _source(step: dict[str, Any], before: dict[str, Any]) -> str:
    parts = []
    for tier in TIERS:
        now = step["stats"].get(tier, {}).get("hit_tokens", 0)
        delta = now - before.get(tier, {}).get("hit_tokens", 0)
        if delta:
            parts.append(f"{tier}:{int(delta)}")
    return " ".join(parts)


SETTLE_SECONDS = 1.0  # between a cold and a warm request: background saves of every config drain
PEER_SOURCES = {
    "vllm-prefix-cache": "vllm prefix cache",
    "example": "ExampleConnector",
    "multi-example": "ExampleConnector",
    "lmcache": "LMCache",
}
RESTART_SOURCES = {
    "example": "example (disk)",
    "multi-example": "example (disk)",
    "kvmux-mux-first": "disk",
    "kvmux-mux-compose": "disk",
    "kvmux-mux-redis": "redis",
    "lmcache": "lmcache server",
}


def restart_files(runner: Runner, config: str) -> Path | None:
    """The directory of files a restart of ``config`` loads from; None: not a local disk."""
    if config in ("example", "multi-example"):
        return runner.work / config  # ExampleConnector's shared_storage_path(s)
    if config in ("kvmux-mux-first", "kvmux-mux-compose"):
        return runner.disk_path
    return None


def long_prompts(runner: Runner, config: str) -> list[dict[str, Any]]:
    """Workload (a): TTFT cold, warm in the same engine (the median of the plan's
    ``warm_repeats``), and warm after a restart.

    A restart that loads from disk finds the files the first engine wrote evicted from
    the page cache (``page_cache.py``); a second restart right after it, the page cache
    as the first left it (``ttft_restart_page_cache_warm_s``).
    """
    prompts = [runner.tokens(1000 + n, n) for n in runner.plan.lengths]
    reset: list[dict[str, Any]] = []
    if config != "vllm-prefix-cache":
        reset.append({"op": "reset_prefix_cache"})
    settle: dict[str, Any] = {"op": "sleep", "seconds": SETTLE_SECONDS}
    repeats = runner.plan.warm_repeats
    steps: list[dict[str, Any]] = []
    for prompt in prompts:  # cold, then ``repeats`` times warm
        repeat: list[dict[str, Any]] = [settle, *reset, _gen([prompt])]
        steps += [_gen([prompt]), *repeat * repeats]
    written_since = time.time()  # the files of the disk tier this engine writes
    first = _generates(runner.run(config, steps))[1:]
    rows = []
    restart = warm_restart = None
    page_cache = None
    if config in RESTART_SOURCES:
        if config == "kvmux-mux-redis":  # empty the disk tier so the hit must come from Redis
            forget_disk(runner.disk_path, runner.plan.disk_capacity)
        again_steps = [s for p in prompts for s in (settle, _gen([p]))]
        files = restart_files(runner, config)
        if files is not None:  # only the engine's files: the tier's filler keeps its pages
            page_cache = page_cache_state(evict_page_cache(files, written_since))
        restart = _generates(runner.run(config, again_steps, fresh=False))
        if files is not None:
            warm_restart = _generates(runner.run(config, again_steps, fresh=False))
    for i, length in enumerate(runner.plan.lengths):
        cold, *warms = first[(1 + repeats) * i : (1 + repeats) * (i + 1)]
        warm = warms[0]
        row = {
            "config": config,
            "prompt_tokens": length,
            "ttft_cold_s": cold["seconds"],
            "ttft_warm_s": statistics.median(w["seconds"] for w in warms),
            "ttft_warm_samples_s": [w["seconds"] for w in warms],
            "warm_cached_tokens": warm["num_cached_tokens"][0],
            "warm_source": _source(warm, cold["stats"])
            or (PEER_SOURCES.get(config, "-") if warm["num_cached_tokens"][0] else "-"),
        }
        if restart is not None:
            again, before = restart[i + 1], restart[i]  # restart[0] is the warm-up
            row["ttft_restart_s"] = again["seconds"]
            row["restart_cached_tokens"] = again["num_cached_tokens"][0]
            row["restart_source"] = _source(again, before["stats"]) or RESTART_SOURCES[config]
        if page_cache is not None:
            row["restart_page_cache"] = page_cache
        if warm_restart is not None:
            again = warm_restart[i + 1]
            row["ttft_restart_page_cache_warm_s"] = again["seconds"]
            row["restart_page_cache_warm_cached_tokens"] = again["num_cached_tokens"][0]
        rows.append(row)
    return rows


def _reuse_requests(runner: Runner) -> list[list[int]]:
    """Conversations over one system prompt, and documents asked several questions, interleaved."""
    plan = runner.plan
    system = runner.tokens(2000, plan.system_tokens)
    conversations = []
    for c in range(plan.conversations):
        history = list(system)
        turns = []
        for t in range(plan.turns):
            history = history + runner.tokens(3000 + 100 * c + t, plan.user_tokens)
            turns.append(list(history))
        conversations.append(turns)
    documents = [runner.tokens(4000 + d, plan.document_tokens) for d in range(plan.documents)]
    asks = [
        [
            doc + runner.tokens(5000 + 100 * d + q, plan.question_tokens)
            for q in range(plan.questions)
        ]
        for d, doc in enumerate(documents)
    ]
    requests: list[list[int]] = []
    for round_ in range(max(plan.turns, plan.questions)):
        requests += [turns[round_] for turns in conversations if round_ < len(turns)]
        requests += [qs[round_] for qs in asks if round_ < len(qs)]
    return requests


def reuse_workload(runner: Runner, config: str) -> dict[str, Any]:
    """Workload (b): TTFT p50/p90, throughput and hit rate per tier with a small engine cache."""
    requests = _reuse_requests(runner)
    longest = max(len(r) for r in requests) + 256
    run = runner.run(
        config,
        [_gen([r]) for r in requests],
        num_gpu_blocks_override=runner.plan.engine_blocks,
        max_model_len=longest,
        max_num_batched_tokens=longest,
    )
    steps = _generates(run)[1:]
    ttfts = sorted(s["seconds"] for s in steps)
    prompt_tokens = sum(len(r) for r in requests)
    cached = sum(s["num_cached_tokens"][0] for s in steps)
    row: dict[str, Any] = {
        "config": config,
        "requests": len(requests),
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        "throughput_tok_s": prompt_tokens / sum(ttfts),
        "hit_rate": cached / prompt_tokens,
    }
    final = steps[-1]["stats"]
    first = _generates(run)[0]["stats"]
    for tier in TIERS:
        if tier in final:
            gained = final[tier]["hit_tokens"] - first.get(tier, {}).get("hit_tokens", 0)
            row[f"hit_rate_{tier}"] = gained / prompt_tokens
    return row


def _overhead_kv(kind: str, children: int, work: Path) -> dict[str, Any]:
    tiers = [{"type": "memory", "capacity": "1GiB", "name": f"m{i}"} for i in range(children)]
    if kind == "mux":
        return {
            "kv_connector": "MuxConnector",
            "kv_connector_module_path": "kvmux.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"policy": "first", "tiers": tiers},
        }
    store = [
        {
            "kv_connector": "StoreConnector",
            "kv_connector_module_path": "kvmux.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"store": t},
        }
        for t in tiers
    ]
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": store},
    }


OVERHEAD_CHUNKS = 4  # samples per engine: each a batch of prompts decoded, hooks timed


def _overhead_samples(runner: Runner, kind: str, children: int) -> list[dict[str, float]]:
    """One engine of ``kind`` over ``children`` tiers: per batch, time added and the
    children's own, per step and side."""
    prompts = [runner.tokens(7000 + i, 512) for i in range(8)]
    chunk = [_gen(prompts, 32), {"op": "hook_times", "reset": True}]
    job = {
        "model": str(runner.model),
        "engine": {
            "dtype": runner.plan.dtype,
            "max_model_len": 2048,
            "enable_prefix_caching": False,
        },
        "kv": _overhead_kv(kind, children, runner.work),
        "steps": [_gen([runner.tokens(1, 256)]), _gen(prompts, 32), {"op": "instrument"}]
        + chunk * OVERHEAD_CHUNKS,
    }
    run = run_engine_job(job, env={**runner.extra_env, "VLLM_CPU_KVCACHE_SPACE": "2"})
    samples = []
    for step in run["steps"]:
        if step["op"] != "hook_times":
            continue
        times = step["seconds"]
        steps = max(1, int(times.get("scheduler/top/build_connector_meta/calls", 1)))
        sample = {"steps": float(steps)}
        for side in ("scheduler", "worker"):
            top, inner = times.get(f"{side}/top", 0.0), times.get(f"{side}/children", 0.0)
            sample[f"{side}_children_us_per_step"] = 1e6 * inner / steps
            sample[f"{side}_added_us_per_step"] = 1e6 * (top - inner) / steps
        samples.append(sample)
    return samples


def mux_overhead(runner: Runner, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Time per step that MuxConnector and vLLM's MultiConnector add over the same children.

    Per children count, the plan's ``overhead_rounds`` engine pairs run in alternating
    order, each engine timing ``OVERHEAD_CHUNKS`` batches; a row holds the medians over
    every batch of its connector (a stray pause of the machine moves one batch only).
    """
    rows = []
    kinds = ("mux", "multi")
    for children in runner.plan.overhead_children:
        samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for r in range(runner.plan.overhead_rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                progress(f"overhead {kind} x{children} (round {r + 1})")
                samples[kind] += _overhead_samples(runner, kind, children)
        for kind in kinds:
            found = samples[kind]
            row: dict[str, Any] = {
                "connector": "MuxConnector" if kind == "mux" else "MultiConnector",
                "children": children,
                "steps": int(sum(s["steps"] for s in found)),
                "samples": len(found),
            }
            for side in ("scheduler", "worker"):
                for name in ("children", "added"):
                    key = f"{side}_{name}_us_per_step"
                    row[key] = statistics.median(s[key] for s in found)
                inner, added = row[f"{side}_children_us_per_step"], row[f"{side}_added_us_per_step"]
                row[f"{side}_added_ratio"] = added / inner if inner else 0.0
            rows.append(row)
    return rows


# -- asynchronous loads: decoding latency while long prompts load -------------------------

DECODE_JOB = "benchmarks.decode_job"
LOADING_TIERS = (("disk", "auto"), ("redis", "auto"), ("disk", "never"))  # never: the contrast


@dataclass(frozen=True)
class LoadingShape:
    """Decoding requests, and long prompts arriving among them to load from a tier."""

    decoders: int = 4  # requests decoding throughout
    decoder_prompt_tokens: int = 64  # under one block: nothing of theirs loads or saves
    loaders: int = 6  # long prompts arriving, one every gap_steps engine steps
    gap_steps: int = 16
    long_tokens: int = 4096  # whole blocks of each long prompt (one more token is computed)
    rounds: int = 6  # each phase this many times, alternating (3 up to run 26)


def _percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1))]


def _window_itls(phase: dict[str, Any]) -> list[float]:
    """Inter-token gaps of the decoding requests from the first arrival to the last load.

    The window ends at the last long prompt's first token: its load (if any) has ended.
    """
    firsts = [t for t in phase["first_tokens"] if t is not None]
    if not phase["arrivals"] or not firsts:
        return []
    start, end = min(phase["arrivals"]), max(firsts)
    return [
        later - earlier
        for times in phase["token_times"]
        for earlier, later in itertools.pairwise(times)
        if start < later <= end
    ]


def _ttfts(phase: dict[str, Any]) -> list[float]:
    pairs = zip(phase["arrivals"], phase["first_tokens"], strict=True)
    return [first - arrival for arrival, first in pairs if first is not None]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def _median_round_ratio(local: list[dict[str, Any]], loading: list[dict[str, Any]]) -> float | None:
    """The p99 ratio of each round's two phases (run back to back), median over rounds.

    Less sensitive than the pooled ratio to whatever else the machine runs meanwhile.
    """
    ratios = []
    for still, busy in zip(local, loading, strict=True):
        p99_still = _percentile(_window_itls(still), 0.99)
        p99_busy = _percentile(_window_itls(busy), 0.99)
        if p99_still and p99_busy:
            ratios.append(p99_busy / p99_still)
    return statistics.median(ratios) if ratios else None


def itl_row(tier: str, mode: str, shape: LoadingShape, result: dict[str, Any]) -> dict[str, Any]:
    """One tier's figures: decode ITL with nothing loading and while the prompts load."""
    local, loading = result["phases"]["local"], result["phases"]["tier"]
    still = [gap for phase in local for gap in _window_itls(phase)]
    busy = [gap for phase in loading for gap in _window_itls(phase)]
    p99_still, p99_busy = _percentile(still, 0.99), _percentile(busy, 0.99)
    loads = "sync" if mode == "never" else "async"
    return {
        "config": f"{tier} ({loads})",
        "tier": tier,
        "loads": loads,
        "decoders": shape.decoders,
        "loading_prompts": shape.loaders,
        "prompt_tokens": shape.long_tokens + 1,
        "rounds": len(loading),
        "loaded_tokens": sum(sum(phase["cached_tokens"]) for phase in loading),
        "itl_p50_ms_no_load": _ms(_percentile(still, 0.5)),
        "itl_p99_ms_no_load": _ms(p99_still),
        "itl_p50_ms_loading": _ms(_percentile(busy, 0.5)),
        "itl_p99_ms_loading": _ms(p99_busy),
        "itl_p99_ratio": p99_busy / p99_still if p99_busy and p99_still else None,
        "itl_p99_ratio_median_round": _median_round_ratio(local, loading),
        "samples_no_load": len(still),
        "samples_loading": len(busy),
        "ttft_p50_ms_no_load": _ms(_percentile([t for p in local for t in _ttfts(p)], 0.5)),
        "ttft_p50_ms_loading": _ms(_percentile([t for p in loading for t in _ttfts(p)], 0.5)),
    }


def loads_while_decoding(
    runner: Runner, tier: str, mode: str = "auto", shape: LoadingShape | None = None
) -> dict[str, Any]:
    """Workload (d): decode ITL p99 while long prompts load from ``tier``, against the same
    workload served from the engine's own prefix cache (nothing loading), in one engine."""
    shape = shape or LoadingShape(long_tokens=min(max(runner.plan.lengths), 4096))
    work = runner.work / f"loading-{tier}-{mode}"
    shutil.rmtree(work, ignore_errors=True)
    if tier == "disk":
        forget_disk(runner.disk_path, runner.plan.disk_capacity)
        store = disk_tier(runner.disk_path, runner.direct_writes, runner.plan.disk_capacity)
    elif runner.redis_url is not None:
        prefix = f"kvmux-loading-{uuid.uuid4().hex[:12]}:"  # nothing stored before
        store = {"type": "redis", "url": runner.redis_url, "key_prefix": prefix}
    else:
        raise RuntimeError("no redis-server available")
    long_prompts = [runner.tokens(8000 + i, shape.long_tokens + 1) for i in range(shape.loaders)]
    decoders = [  # fresh ones for every phase of every round
        [
            runner.tokens(8100 + 10 * phase + i, shape.decoder_prompt_tokens)
            for i in range(shape.decoders)
        ]
        for phase in range(2 * shape.rounds)
    ]
    job = {
        "model": str(runner.model),
        "engine": {
            "dtype": runner.plan.dtype,
            "max_model_len": shape.long_tokens + 256,
            "max_num_batched_tokens": 2048,
            "enable_prefix_caching": True,
        },
        "kv": {
            "kv_connector": "StoreConnector",
            "kv_connector_module_path": "kvmux.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"store": {**store, "async_loads": mode}},
        },
        "warmup": runner.tokens(1, 256),
        "long_prompts": long_prompts,
        "decoders": decoders,
        "gap_steps": shape.gap_steps,
        "rounds": shape.rounds,
        "decode_tokens": shape.loaders * shape.gap_steps + 64,  # decoding past the last load
        "multiprocess": True,  # vLLM's default layout: the loader threads off the forward pass
    }
    result = run_engine_job(job, env=runner.engine_env, module=DECODE_JOB, timeout=3600)
    return itl_row(tier, mode, shape, result)


def async_loads(
    runner: Runner, progress: Callable[[str], None], quick: bool = False
) -> list[dict[str, Any]]:
    """Workload (d) over every tier of ``LOADING_TIERS``: one row each (``quick``: a smoke
    run, disk only, two loads in one round)."""
    tiers: tuple[tuple[str, str], ...] = LOADING_TIERS
    shape = None
    if quick:
        tokens = min(max(runner.plan.lengths), 4096)
        tiers, shape = LOADING_TIERS[:1], LoadingShape(loaders=2, rounds=1, long_tokens=tokens)
    rows = []
    for tier, mode in tiers:
        progress(f"loads while decoding: {tier} ({mode})")
        rows.append(loads_while_decoding(runner, tier, mode, shape))
    return rows
