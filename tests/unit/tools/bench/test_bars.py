"""The issue's bars, computed from a run's results."""

from __future__ import annotations

from kvmux.tools.bench.bars import evaluate_bars


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
