"""Warm TTFT side by side: the memory tier's hit against vLLM's own prefix-cache hit.

Both engines run in vLLM's default multi-process layout, compute every prompt once, then
take turns (``turns.py``): in each turn one engine answers every prompt again, warm. The
prefix-cache engine's hits come from vLLM's own cache; the kvmux engine's own cache is
reset before each request, so every hit loads from the memory tier. The bar is, per
prompt length, the median over the rounds of the two engines' ratio.
"""

from __future__ import annotations

from typing import Any

from benchmarks.turns import BenchRunner, Steps, take_turns

__all__ = ["WARM_CONFIGS", "warm_ratios", "warm_rounds"]

WARM_CONFIGS = ("vllm-prefix-cache", "kvmux-memory")  # baseline first
PAUSE_S = 1.0  # before each turn (and after the prelude: its saves land)


def _prompts(runner: BenchRunner) -> list[list[int]]:
    return [runner.tokens(1000 + n, n) for n in runner.plan.lengths]  # workload (a)'s


def warm_rounds(runner: BenchRunner, rounds: int) -> list[dict[str, Any]]:
    """A row per engine, round and prompt length (or an error row per engine)."""
    prompts = _prompts(runner)

    def generate(prompt: list[int]) -> dict[str, Any]:
        return {"op": "generate", "prompts": [prompt], "max_tokens": 1}

    def prelude(_: str) -> Steps:
        return [*map(generate, prompts), {"op": "sleep", "seconds": PAUSE_S}]

    def turn(config: str, _: int) -> Steps:
        reset = [] if config == WARM_CONFIGS[0] else [{"op": "reset_prefix_cache"}]
        return [step for prompt in prompts for step in (*reset, generate(prompt))]

    result = take_turns(runner, WARM_CONFIGS, prelude, turn, rounds, PAUSE_S, multiprocess=True)
    rows: list[dict[str, Any]] = []
    for config, turns in result.items():
        if isinstance(turns, str):
            rows.append({"config": config, "error": turns})
            continue
        for round_, generates in enumerate(turns):
            for length, generated in zip(runner.plan.lengths, generates, strict=True):
                rows.append(
                    {
                        "config": config,
                        "prompt_tokens": length,
                        "round": round_,
                        "ttft_s": generated["seconds"],
                        "cached_tokens": generated["num_cached_tokens"][0],
                    }
                )
    return rows


def warm_ratios(rows: list[dict[str, Any]], tokens: int) -> list[float]:
    """kvmux-memory / prefix-cache warm TTFT of each round, at ``tokens`` tokens."""
    ttft = {
        (r["config"], r["round"]): r["ttft_s"]
        for r in rows
        if r.get("prompt_tokens") == tokens and "error" not in r
    }
    rounds = sorted({round_ for _, round_ in ttft})
    baseline, measured = WARM_CONFIGS
    return [
        ttft[measured, round_] / ttft[baseline, round_]
        for round_ in rounds
        if (measured, round_) in ttft and ttft.get((baseline, round_))
    ]
