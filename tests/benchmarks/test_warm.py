"""Warm TTFT side by side: the kvmux engine's own cache is reset before each warm request."""

from __future__ import annotations

import pytest

from benchmarks import warm
from benchmarks.warm import WARM_CONFIGS, warm_ratios, warm_rounds
from tests.support.turn_runner import TurnTakingRunner


def test_every_warm_turn_asks_every_prompt_and_kvmux_resets_its_own_cache_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm, "PAUSE_S", 0.0)
    prefix, kvmux = WARM_CONFIGS
    runner = TurnTakingRunner({prefix: 0.1, kvmux: 0.11}, lengths=(8, 16))
    scripts = runner.scripts
    rows = warm_rounds(runner, 3)
    assert len(rows) == 2 * 3 * 2
    assert {(r["config"], r["round"], r["prompt_tokens"]) for r in rows} == {
        (c, n, t) for c in WARM_CONFIGS for n in range(3) for t in (8, 16)
    }
    assert warm_ratios(rows, 16) == pytest.approx([1.1] * 3)
    ops = {config: [s["op"] for s in steps] for config, steps in scripts.items()}
    assert ops[kvmux].count("reset_prefix_cache") == 3 * 2  # before every warm request
    assert "reset_prefix_cache" not in ops[prefix]  # its hits are vLLM's own
    assert ops[kvmux][:2] == ["generate", "generate"]  # every prompt computed first


def test_a_failing_engine_is_an_error_row() -> None:
    runner = TurnTakingRunner({WARM_CONFIGS[0]: 0.1}, fail=WARM_CONFIGS[1], lengths=(8,))
    rows = warm_rounds(runner, 2)
    assert [r["config"] for r in rows if "error" in r] == [WARM_CONFIGS[1]]
    assert warm_ratios(rows, 8) == []
