"""The issue's bars, computed from a run's results."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvmux.tools.bench.bars import evaluate_bars, saving_costs
from kvmux.tools.bench.e2e import LAYOUTS, noreuse_seed
from kvmux.tools.bench.profiles import FULL
from kvmux.tools.bench.run import _pairs


def _long(config: str, tokens: int, warm: float) -> dict[str, object]:
    return {"config": config, "prompt_tokens": tokens, "ttft_warm_s": warm, "ttft_cold_s": 1.0}


def test_memory_warm_ttft_is_held_to_1_1x_the_prefix_cache_at_4k_and_8k() -> None:
    rows = [
        _long("kvmux-memory", 4096, 0.105),
        _long("vllm-prefix-cache", 4096, 0.100),
        _long("kvmux-memory", 8192, 0.240),
        _long("vllm-prefix-cache", 8192, 0.200),
    ]
    bars = {b["bar"]: b for b in evaluate_bars({"long_prompts": rows})}
    at_4k = bars["memory warm TTFT / vLLM prefix-cache warm TTFT (4096 tokens)"]
    at_8k = bars["memory warm TTFT / vLLM prefix-cache warm TTFT (8192 tokens)"]
    assert (at_4k["measured"], at_4k["limit"], at_4k["met"]) == (1.05, 1.1, True)
    assert (at_8k["measured"], at_8k["limit"], at_8k["met"]) == (1.2, 1.1, False)
    assert not any("ExampleConnector" in name for name in bars)  # the replaced bar


def test_memory_store_operations_are_held_to_0_8_of_a_copy() -> None:
    stores = {
        "rows": [
            {"tier": "memory", "op": "put", "ratio": 0.7},
            {"tier": "disk", "op": "put", "ratio": 0.7},
        ]
    }
    bars = {b["bar"]: b for b in evaluate_bars({"stores": stores})}
    assert (bars["memory put / its limit"]["limit"], bars["memory put / its limit"]["met"]) == (
        0.8,
        False,
    )
    assert bars["disk put / its limit"]["met"] is True


def _throughput(config: str, layout: str, pair: int, tok_s: float) -> dict[str, object]:
    return {"config": config, "layout": layout, "pair": pair, "throughput_tok_s": tok_s}


def test_saving_cost_is_the_median_over_engine_pairs_in_the_default_layout() -> None:
    rows = [
        _throughput("none", "multi-process", 0, 100.0),
        _throughput("kvmux-mux-redis", "multi-process", 0, 97.0),
        _throughput("kvmux-mux-redis", "multi-process", 1, 80.0),  # pair 1 ran kvmux first
        _throughput("none", "multi-process", 1, 100.0),
        _throughput("none", "multi-process", 2, 100.0),
        _throughput("kvmux-mux-redis", "multi-process", 2, 96.0),
        _throughput("none", "in-process", 0, 100.0),
        _throughput("kvmux-mux-redis", "in-process", 0, 50.0),
        {"config": "kvmux-mux-redis", "layout": "multi-process", "pair": 3, "error": "x"},
        _throughput("none", "multi-process", 3, 100.0),
    ]
    assert saving_costs(rows, "kvmux-mux-redis", "multi-process") == pytest.approx(
        [0.03, 0.2, 0.04]
    )
    assert saving_costs(rows, "kvmux-mux-redis", "in-process") == pytest.approx([0.5])
    (bar,) = [b for b in evaluate_bars({"no_reuse": rows}) if b["bar"].startswith("saving")]
    assert "multi-process, median of 3 engine pairs" in bar["bar"]
    assert (bar["measured"], bar["limit"], bar["met"]) == (0.04, 0.05, True)


def test_saving_cost_without_pairs_is_not_measured() -> None:
    (bar,) = [b for b in evaluate_bars({}) if b["bar"].startswith("saving")]
    assert (bar["measured"], bar["met"], bar["note"]) == (None, False, "not measured")


def test_saving_pairs_alternate_their_order() -> None:
    plan = replace(FULL, saving_pairs=3)
    assert _pairs(["none", "kvmux"], plan) == [
        (0, "none"),
        (0, "kvmux"),
        (1, "kvmux"),
        (1, "none"),
        (2, "none"),
        (2, "kvmux"),
    ]


def test_every_saving_run_sees_prompts_no_earlier_run_saved() -> None:
    seeds = [
        noreuse_seed(layout, pair, round_, prompt)
        for layout in LAYOUTS
        for pair in range(FULL.saving_pairs)
        for round_ in range(2)
        for prompt in range(FULL.noreuse_prompts)
    ]
    assert len(set(seeds)) == len(seeds)
    assert min(seeds) > 10_000  # above every other workload's seeds
