"""Workload (c), the saving cost: engines with and without kvmux, alive side by side.

Engines started one after the other met machines in different moods: an engine without a
connector alone ran at 1686 to 1914 tok/s within one run, so one pair of engines swung by
more than the 5% bar either way. Here both engines start together and take turns, round
by round (the order reversed every other round), so a slow spell of the machine hits
both alike. Each round is a batch of distinct prompts; the one measuring waits a pause
first, in which the other's background work (kvmux's writes of its last step) ends.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol

from kvmux.tools.bench.profiles import BenchPlan

__all__ = [
    "LAYOUTS",
    "SAVING_CONFIGS",
    "noreuse_seed",
    "round_costs",
    "saving_rounds",
    "turn_order",
]

LAYOUTS = ("multi-process", "in-process")  # vLLM's default layout first: the bar's
SAVING_CONFIGS = ("none", "kvmux-mux-redis")  # baseline first
PAUSE_S = 2.0  # before each measured round: the other engine's writes settle
WAIT_S = 1800.0  # how long an engine waits for its turn at most
WARM_ROUND = 99  # seed round of each engine's unmeasured first batch


class _Runner(Protocol):
    plan: BenchPlan

    def tokens(self, seed: int, count: int) -> list[int]: ...

    def run(self, config: str, steps: list[dict[str, Any]], **engine: Any) -> dict[str, Any]: ...


def noreuse_seed(layout: str, round_: int, prompt: int) -> int:
    """Seed of one workload (c) prompt: distinct for every layout and round.

    The Redis tier outlives an engine, so a prompt seen before would load, not save.
    """
    return 100_000 * (1 + LAYOUTS.index(layout)) + 100 * round_ + prompt


def turn_order(rounds: int, configs: Sequence[str] = SAVING_CONFIGS) -> list[tuple[str, int]]:
    """The turns (config, round): every round each config once, every other one reversed."""
    return [
        (config, round_)
        for round_ in range(rounds)
        for config in (configs if round_ % 2 == 0 else configs[::-1])
    ]


def _engine_steps(
    runner: _Runner, config: str, layout: str, turns: list[tuple[str, int]], sync: Path
) -> list[dict[str, Any]]:
    """One engine's script: a warm batch, then its turns, each after the turn before."""
    plan = runner.plan

    def batch(round_: int) -> dict[str, Any]:
        prompts = [
            runner.tokens(noreuse_seed(layout, round_, i), plan.noreuse_tokens)
            for i in range(plan.noreuse_prompts)
        ]
        return {"op": "generate", "prompts": prompts, "max_tokens": plan.noreuse_max_tokens}

    others = [c for c, _ in turns if c != config]
    steps = [batch(WARM_ROUND), {"op": "touch", "path": str(sync / f"ready-{config}")}]
    for turn, (owner, round_) in enumerate(turns):
        if owner != config:
            continue
        before = f"turn-{turn - 1}" if turn else f"ready-{others[0]}"
        steps += [
            {"op": "wait_file", "path": str(sync / before), "timeout": WAIT_S},
            {"op": "sleep", "seconds": PAUSE_S},
            {**batch(round_), "turn": turn},
            {"op": "touch", "path": str(sync / f"turn-{turn}")},
        ]
    return steps


def _rows(
    config: str, layout: str, steps: list[dict[str, Any]], tokens: int
) -> list[dict[str, Any]]:
    generates = [s for s in steps if s["op"] == "generate"][2:]  # past warm-up and warm batch
    return [
        {
            "config": config,
            "layout": layout,
            "round": round_,
            "seconds": step["seconds"],
            "throughput_tok_s": tokens / step["seconds"],
        }
        for round_, step in enumerate(generates)
    ]


def saving_rounds(
    runner: _Runner, layout: str, rounds: int, configs: tuple[str, str] = SAVING_CONFIGS
) -> list[dict[str, Any]]:
    """Workload (c) in one vLLM layout: a row per engine and round (or an error row).

    ``configs`` are the baseline and the configuration measured against it.

    In the multi-process layout (vLLM's default, ``vllm serve``'s) the CPU backend binds
    the forward pass to the cores it does not reserve; in-process it uses every core.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    plan = runner.plan
    tokens = plan.noreuse_prompts * (plan.noreuse_tokens + plan.noreuse_max_tokens)
    turns = turn_order(rounds, configs)
    with tempfile.TemporaryDirectory(prefix="kvmux-saving-") as tmp, ThreadPoolExecutor(2) as pool:
        sync = Path(tmp)
        futures = {
            config: pool.submit(
                runner.run,
                config,
                _engine_steps(runner, config, layout, turns, sync),
                multiprocess=layout == "multi-process",
                num_gpu_blocks_override=plan.engine_blocks * 4,
            )
            for config in configs
        }
        wait(futures.values(), return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures.values()):
            _release_all(sync, configs, len(turns))  # the other engine runs on without waiting
        rows: list[dict[str, Any]] = []
        for config, future in futures.items():
            error = future.exception()
            if error is None:
                rows += _rows(config, layout, future.result()["steps"], tokens)
            else:
                message = f"{type(error).__name__}: {str(error).splitlines()[0][:800]}"
                rows.append({"config": config, "layout": layout, "error": message})
    return rows


def _release_all(sync: Path, configs: Sequence[str], turns: int) -> None:
    """Every file an engine may wait for: no engine waits for one that failed."""
    for name in [f"ready-{c}" for c in configs] + [f"turn-{t}" for t in range(turns)]:
        (sync / name).touch()


def round_costs(
    rows: list[dict[str, Any]], config: str, layout: str, baseline: str = SAVING_CONFIGS[0]
) -> list[float]:
    """1 - throughput(config) / throughput(baseline) of each round run in ``layout``."""
    throughput = {
        (r["config"], r["round"]): r["throughput_tok_s"]
        for r in rows
        if r.get("layout") == layout and "error" not in r and "round" in r
    }
    rounds = sorted({round_ for _, round_ in throughput})
    return [
        1 - throughput[config, round_] / throughput[baseline, round_]
        for round_ in rounds
        if (config, round_) in throughput and (baseline, round_) in throughput
    ]
