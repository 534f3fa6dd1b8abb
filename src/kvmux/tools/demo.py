"""``kvmux demo``: long prompts cold, warm from memory, and warm from disk after a restart.

Each engine first serves an untimed warm-up request (its own prompt, sharing no prefix
with the measured ones), so start-up costs are not charged to any row. Three distinct
prompts of one length are then each sent once cold (and saved), once warm in the same
engine, and once warm in a restarted engine (memory tier empty, disk tier full); a row
reports the median of its three requests.
"""

from __future__ import annotations

import random
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import MODEL_SIZES, build_random_llama

__all__ = ["REQUESTS_PER_ROW", "DemoRow", "demo_prompts", "format_table", "run_demo"]

TIERS = ("memory", "disk")
REQUESTS_PER_ROW = 3  # a row's time is the median of this many requests
ROWS = ("cold", "warm (same engine)", "warm (after restart)")


@dataclass(frozen=True)
class DemoRow:
    """One line of the demo's table: the median of its requests."""

    run: str
    prompt_tokens: int
    cached_tokens: int  # median over the row's requests
    loaded_by_tier: dict[str, int]  # tokens each tier supplied, median per request
    ttft_seconds: float  # median time to first token
    first_tokens: tuple[int, ...]  # the first generated token of each prompt, in order


def demo_prompts(count: int, length: int, vocab_size: int, seed: int = 7) -> list[list[int]]:
    """``count`` random prompts of ``length`` tokens; prompt ``i`` starts with token ``i + 1``,
    so no two share a prefix (not even their first block)."""
    rng = random.Random(seed)
    return [
        [i + 1, *(rng.randrange(1, vocab_size) for _ in range(length - 1))] for i in range(count)
    ]


def _kv_config(disk_path: Path) -> dict[str, Any]:
    memory = {"type": "memory", "capacity": "1GiB", "name": "memory"}
    disk = {"type": "disk", "path": str(disk_path), "capacity": "4GiB", "name": "disk"}
    return {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "compose", "tiers": [memory, disk]},
    }


def _generate(prompt: list[int]) -> dict[str, Any]:
    return {"op": "generate", "prompts": [prompt], "max_tokens": 1}


def _measured(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timed requests of one engine: every generate step after the warm-up."""
    return [s for s in steps if s["op"] == "generate"][1:]


def _loaded(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Tokens each tier supplied between two snapshots of the tiers' counters."""
    hits = {
        tier: after.get(tier, {}).get("hit_tokens", 0) - before.get(tier, {}).get("hit_tokens", 0)
        for tier in TIERS
    }
    return {tier: int(n) for tier, n in hits.items()}


def _row(name: str, prompt_len: int, steps: list[dict[str, Any]], base: dict[str, Any]) -> DemoRow:
    """One row from its requests' results; ``base`` is the tiers' counters before them."""
    loads, before = [], base
    for step in steps:
        loads.append(_loaded(before, step["stats"]))
        before = step["stats"]
    return DemoRow(
        run=name,
        prompt_tokens=prompt_len,
        cached_tokens=int(statistics.median(s["num_cached_tokens"][0] for s in steps)),
        loaded_by_tier={t: int(statistics.median(load[t] for load in loads)) for t in TIERS},
        ttft_seconds=statistics.median(s["seconds"] for s in steps),
        first_tokens=tuple(s["tokens"][0][0] for s in steps),
    )


def demo_rows(
    first: list[dict[str, Any]], second: list[dict[str, Any]], prompt_len: int
) -> list[DemoRow]:
    """The table's rows from both engines' step results (warm-up first in each)."""
    n = REQUESTS_PER_ROW
    ours, restarted = _measured(first), _measured(second)
    warmed = next(s for s in first if s["op"] == "generate")["stats"]
    rows = [
        _row(ROWS[0], prompt_len, ours[:n], warmed),
        _row(ROWS[1], prompt_len, ours[n : 2 * n], ours[n - 1]["stats"]),
    ]
    warmed = next(s for s in second if s["op"] == "generate")["stats"]
    return [*rows, _row(ROWS[2], prompt_len, restarted[:n], warmed)]


def run_demo(workdir: Path, prompt_tokens: int = 3000) -> list[DemoRow]:
    """Run the demo in ``workdir`` (model cached there, disk tier emptied first)."""
    model = build_random_llama(workdir / "model-demo", size="demo")
    disk = workdir / "disk-tier"
    shutil.rmtree(disk, ignore_errors=True)
    n = REQUESTS_PER_ROW
    prompts = demo_prompts(n + 2, prompt_tokens, MODEL_SIZES["demo"].vocab_size)
    measured, warm_ups = prompts[:n], prompts[n:]  # one warm-up prompt per engine
    engine = {
        "enable_prefix_caching": False,
        "max_model_len": prompt_tokens + 64,
        "max_num_batched_tokens": 2048,
        "dtype": "float32",
    }
    job = {"model": str(model), "engine": engine, "kv": _kv_config(disk)}
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}  # see README
    timed = [_generate(p) for p in measured]
    first = run_engine_job({**job, "steps": [_generate(warm_ups[0]), *timed, *timed]}, env=env)
    second = run_engine_job({**job, "steps": [_generate(warm_ups[1]), *timed]}, env=env)
    return demo_rows(first["steps"], second["steps"], prompt_tokens)


def format_table(rows: list[DemoRow]) -> str:
    """The demo's result as an aligned text table, with what it measures."""
    header = ["run", "prompt tokens", "loaded tokens", "from tier", "TTFT (s)", "speed-up"]
    cold = rows[0].ttft_seconds
    lines = [header]
    for row in rows:
        tiers = ", ".join(f"{t}: {n}" for t, n in row.loaded_by_tier.items() if n) or "-"
        lines.append(
            [
                row.run,
                str(row.prompt_tokens),
                str(row.cached_tokens),
                tiers,
                f"{row.ttft_seconds:.3f}",
                f"{cold / row.ttft_seconds:.1f}x",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        f"TTFT: median of {REQUESTS_PER_ROW} requests per row, one per distinct prompt; "
        "each engine warmed up first (untimed)."
    ]
    for line in lines:
        text.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    same = len({row.first_tokens for row in rows}) == 1
    text.append(f"first generated token identical in every run: {'yes' if same else 'NO'}")
    return "\n".join(text)
