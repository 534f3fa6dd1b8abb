"""Workload (c), the saving cost: an engine with kvmux and one without, side by side.

Both take turns (``turns.py``), each turn a batch of distinct prompts, the order reversed
every other round. An engine runs faster in the second of its two turns in a row (a
round's first turn follows its own last one) than in a turn right after the other
engine: a round alone leans by that much to one side or the other. So the cost is taken
over pairs of rounds, one of each order: 1 - the pair's geometric mean throughput with
kvmux / without; the bar is the median over the pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.turns import BenchRunner, Steps, take_turns

__all__ = [
    "LAYOUTS",
    "SAVING_CONFIGS",
    "noreuse_seed",
    "pair_costs",
    "round_costs",
    "saving_batch",
    "saving_rounds",
    "warm_round",
]

LAYOUTS = ("multi-process", "in-process")  # vLLM's default layout first: the bar's
SAVING_CONFIGS = ("none", "kvmux-mux-redis")  # baseline first
PAUSE_S = 2.0  # before each turn: the other engine's writes of its last step end
WARM_ROUND = 99  # seed round of the first session's unmeasured first batch (then 98, ...)


def noreuse_seed(layout: str, round_: int, prompt: int) -> int:
    """Seed of one workload (c) prompt: distinct for every layout and round.

    The Redis tier outlives an engine, so a prompt seen before would load, not save.
    """
    return 100_000 * (1 + LAYOUTS.index(layout)) + 100 * round_ + prompt


def warm_round(session: int) -> int:
    """Seed round of the unmeasured first batch of a session's engines."""
    return WARM_ROUND - session


def saving_batch(runner: BenchRunner, seed_of: Callable[[int], int]) -> dict[str, Any]:
    """The generate step of one batch of the workload: prompt ``i`` from ``seed_of(i)``."""
    plan = runner.plan
    prompts = [runner.tokens(seed_of(i), plan.noreuse_tokens) for i in range(plan.noreuse_prompts)]
    return {"op": "generate", "prompts": prompts, "max_tokens": plan.noreuse_max_tokens}


def saving_rounds(
    runner: BenchRunner,
    layout: str,
    rounds: int,
    configs: tuple[str, str] = SAVING_CONFIGS,
    sessions: int = 1,
) -> list[dict[str, Any]]:
    """Workload (c) in one vLLM layout: a row per engine and round (or an error row).

    ``configs`` are the baseline and the configuration measured against it. Each of the
    ``sessions`` starts a fresh pair of engines for ``rounds`` rounds: one engine can run a
    few percent faster or slower than its twin for its whole life, so a cost measured on
    one pair alone carries that pair's luck. In the multi-process layout (vLLM's default,
    ``vllm serve``'s) the CPU backend binds the forward pass to the cores it does not
    reserve; in-process it uses every core.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    if rounds < 1 or sessions < 1 or sessions * rounds > warm_round(sessions - 1):
        raise ValueError(f"{sessions} sessions of {rounds} rounds: too few or too many")
    if rounds % 2:
        raise ValueError(f"{rounds} rounds: an even number is needed (costs count pairs)")
    rows: list[dict[str, Any]] = []
    for session in range(sessions):
        rows += _session(runner, layout, rounds, configs, session)
    return rows


def _session(
    runner: BenchRunner, layout: str, rounds: int, configs: tuple[str, str], session: int
) -> list[dict[str, Any]]:
    """One pair of engines taking ``rounds`` turns each; rounds numbered across sessions."""
    plan, first = runner.plan, session * rounds

    def batch(round_: int) -> Steps:
        return [saving_batch(runner, lambda i: noreuse_seed(layout, round_, i))]

    result = take_turns(
        runner,
        configs,
        lambda _: batch(warm_round(session)),
        lambda _, round_: batch(first + round_),
        rounds,
        PAUSE_S,
        multiprocess=layout == "multi-process",
        num_gpu_blocks_override=plan.engine_blocks * 4,
    )
    tokens = plan.noreuse_prompts * (plan.noreuse_tokens + plan.noreuse_max_tokens)
    rows: list[dict[str, Any]] = []
    for config, turns in result.items():
        if isinstance(turns, str):
            rows.append({"config": config, "layout": layout, "session": session, "error": turns})
            continue
        rows += [
            {
                "config": config,
                "layout": layout,
                "session": session,
                "round": first + round_,
                "seconds": generated["seconds"],
                "throughput_tok_s": tokens / generated["seconds"],
            }
            for round_, (generated,) in enumerate(turns)
        ]
    return rows


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


def pair_costs(
    rows: list[dict[str, Any]], config: str, layout: str, baseline: str = SAVING_CONFIGS[0]
) -> list[float]:
    """1 - geometric mean throughput(config) / that of ``baseline``, per pair of rounds.

    A pair is rounds ``2k`` and ``2k + 1`` of one engine pair (``session``), one in each
    order, so that the lead of an engine's second turn in a row cancels out; a pair that
    lacks a measurement is left out.
    """
    throughput = {
        (r["config"], r.get("session", 0), r["round"]): r["throughput_tok_s"]
        for r in rows
        if r.get("layout") == layout and "error" not in r and "round" in r
    }
    costs = []
    for session in sorted({s for _, s, _ in throughput}):
        firsts = sorted({r for _, s, r in throughput if s == session and r % 2 == 0})
        for first in firsts:
            keys = [(c, session, r) for c in (config, baseline) for r in (first, first + 1)]
            if all(key in throughput for key in keys):
                measured, base = (
                    throughput[keys[0]] * throughput[keys[1]],
                    throughput[keys[2]] * throughput[keys[3]],
                )
                costs.append(1 - math.sqrt(measured / base))
    return costs
