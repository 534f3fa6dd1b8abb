"""``kvmux demo``: one long prompt, cold, warm from memory, and warm from disk after a restart."""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmux.tools.engine import run_engine_job
from kvmux.tools.models import MODEL_SIZES, build_random_llama

__all__ = ["DemoRow", "run_demo"]

TIERS = ("memory", "disk")


@dataclass(frozen=True)
class DemoRow:
    """One line of the demo's table."""

    run: str
    prompt_tokens: int
    cached_tokens: int
    loaded_by_tier: dict[str, int]
    ttft_seconds: float
    first_token: int


def _kv_config(disk_path: Path) -> dict[str, Any]:
    memory = {"type": "memory", "capacity": "1GiB", "name": "memory"}
    disk = {"type": "disk", "path": str(disk_path), "capacity": "4GiB", "name": "disk"}
    return {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "compose", "tiers": [memory, disk]},
    }


def _rows(names: list[str], steps: list[dict[str, Any]], prompt_len: int) -> list[DemoRow]:
    rows, before = [], {tier: 0.0 for tier in TIERS}
    for name, step in zip(names, steps, strict=True):
        stats = step["stats"]
        after = {tier: stats.get(tier, {}).get("hit_tokens", 0) for tier in TIERS}
        loaded = {tier: int(after[tier] - before[tier]) for tier in TIERS}
        before = after
        rows.append(
            DemoRow(
                name,
                prompt_len,
                step["num_cached_tokens"][0],
                loaded,
                step["seconds"],
                step["tokens"][0][0],
            )
        )
    return rows


def run_demo(workdir: Path, prompt_tokens: int = 3000) -> list[DemoRow]:
    """Run the demo in ``workdir`` (model cached there, disk tier emptied first)."""
    model = build_random_llama(workdir / "model-demo", size="demo")
    disk = workdir / "disk-tier"
    shutil.rmtree(disk, ignore_errors=True)
    rng = random.Random(7)
    prompt = [rng.randrange(1, MODEL_SIZES["demo"].vocab_size) for _ in range(prompt_tokens)]
    gen = {"op": "generate", "prompts": [prompt], "max_tokens": 1}
    engine = {
        "enable_prefix_caching": False,
        "max_model_len": prompt_tokens + 64,
        "max_num_batched_tokens": 2048,
        "dtype": "float32",
    }
    job = {"model": str(model), "engine": engine, "kv": _kv_config(disk)}
    env = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    first = run_engine_job({**job, "steps": [gen, gen]}, env=env)
    second = run_engine_job({**job, "steps": [gen]}, env=env)
    steps = [s for s in first["steps"] + second["steps"] if s["op"] == "generate"]
    rows = _rows(["cold", "warm (same engine)"], steps[:2], prompt_tokens)
    rows += _rows(["warm (after restart)"], steps[2:], prompt_tokens)
    return rows


def format_table(rows: list[DemoRow]) -> str:
    """The demo's result as an aligned text table."""
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
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    ]
    same = len({row.first_token for row in rows}) == 1
    text.append(f"first generated token identical in every run: {'yes' if same else 'NO'}")
    return "\n".join(text)
