"""Workload (c): engines with and without kvmux take turns, and the cost per round."""

from __future__ import annotations

from typing import Any

import pytest

from kvmux.tools.bench import saving
from kvmux.tools.bench.bars import evaluate_bars
from kvmux.tools.bench.profiles import FULL
from kvmux.tools.bench.saving import (
    LAYOUTS,
    WARM_ROUND,
    noreuse_seed,
    round_costs,
    saving_rounds,
    warm_round,
)
from kvmux.tools.bench.turns import turn_order
from tests.support.turn_runner import TurnTakingRunner

SMALL: dict[str, Any] = {"noreuse_prompts": 2, "noreuse_tokens": 4, "noreuse_max_tokens": 1}


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saving, "PAUSE_S", 0.0)


def test_engines_take_their_turns_one_after_the_other() -> None:
    runner = TurnTakingRunner({"none": 2.0, "kvmux-mux-redis": 2.5}, **SMALL)
    rows = saving_rounds(runner, "multi-process", 4)
    measured = [(c, p[0][0]) for c, p in runner.log if p[0][0] // 100 % 1000 != WARM_ROUND]
    expected = [
        (config, noreuse_seed("multi-process", round_, 0))
        for config, round_ in turn_order(4, saving.SAVING_CONFIGS)
    ]
    assert measured == expected
    assert [(r["config"], r["round"]) for r in rows] == [
        (c, r) for c in saving.SAVING_CONFIGS for r in range(4)
    ]
    tokens = runner.plan.noreuse_prompts * 5
    assert rows[0]["throughput_tok_s"] == pytest.approx(tokens / 2.0)
    assert round_costs(rows, "kvmux-mux-redis", "multi-process") == pytest.approx([0.2] * 4)


def test_each_session_is_a_fresh_engine_pair_with_rounds_numbered_on() -> None:
    runner = TurnTakingRunner({"none": 2.0, "kvmux-mux-redis": 2.2}, **SMALL)
    rows = saving_rounds(runner, "multi-process", 2, sessions=3)
    assert runner.engines_started == 6  # two per session
    assert [(r["session"], r["round"]) for r in rows if r["config"] == "none"] == [
        (0, 0),
        (0, 1),
        (1, 2),
        (1, 3),
        (2, 4),
        (2, 5),
    ]
    seeds = {p[0][0] for _, p in runner.log}
    warm = {noreuse_seed("multi-process", warm_round(s), 0) for s in range(3)}
    measured = {noreuse_seed("multi-process", r, 0) for r in range(6)}
    assert seeds == warm | measured  # every session's warm-up batch is new to the tiers too
    assert len(round_costs(rows, "kvmux-mux-redis", "multi-process")) == 6
    (bar,) = [b for b in evaluate_bars({"no_reuse": rows}) if b["bar"].startswith("saving")]
    assert "median of 6 alternating rounds, 3 engine pairs" in bar["bar"]


@pytest.mark.parametrize(("rounds", "sessions"), [(0, 1), (1, 0), (40, 3)])
def test_sessions_that_cannot_be_seeded_apart_are_refused(rounds: int, sessions: int) -> None:
    with pytest.raises(ValueError, match="too few or too many"):
        saving_rounds(TurnTakingRunner({}), "multi-process", rounds, sessions=sessions)


def test_a_failing_engine_is_an_error_row_and_the_other_does_not_wait_for_it() -> None:
    runner = TurnTakingRunner({"none": 1.0}, fail="kvmux-mux-redis", **SMALL)
    rows = saving_rounds(runner, "in-process", 3)
    errors = [r for r in rows if "error" in r]
    assert [(r["config"], r["layout"]) for r in errors] == [("kvmux-mux-redis", "in-process")]
    assert "boom" in errors[0]["error"]
    assert len([r for r in rows if r["config"] == "none"]) == 3


def test_saving_cost_is_the_median_over_rounds_in_the_default_layout() -> None:
    def row(config: str, layout: str, round_: int, tok_s: float) -> dict[str, Any]:
        return {"config": config, "layout": layout, "round": round_, "throughput_tok_s": tok_s}

    rows = [
        row("none", "multi-process", 0, 100.0),
        row("kvmux-mux-redis", "multi-process", 0, 97.0),
        row("kvmux-mux-redis", "multi-process", 1, 80.0),
        row("none", "multi-process", 1, 100.0),
        row("none", "multi-process", 2, 100.0),
        row("kvmux-mux-redis", "multi-process", 2, 96.0),
        row("none", "in-process", 0, 100.0),
        row("kvmux-mux-redis", "in-process", 0, 50.0),
        {"config": "kvmux-mux-redis", "layout": "multi-process", "error": "x"},
    ]
    assert round_costs(rows, "kvmux-mux-redis", "multi-process") == pytest.approx([0.03, 0.2, 0.04])
    assert round_costs(rows, "kvmux-mux-redis", "in-process") == pytest.approx([0.5])
    (bar,) = [b for b in evaluate_bars({"no_reuse": rows}) if b["bar"].startswith("saving")]
    assert "multi-process, median of 3 alternating rounds" in bar["bar"]
    assert (bar["measured"], bar["limit"], bar["met"]) == (0.04, 0.05, True)


def test_saving_cost_without_rounds_is_not_measured() -> None:
    (bar,) = [b for b in evaluate_bars({}) if b["bar"].startswith("saving")]
    assert (bar["measured"], bar["met"], bar["note"]) == (None, False, "not measured")


def test_every_saving_round_sees_prompts_no_earlier_round_saved() -> None:
    seeds = [
        noreuse_seed(layout, round_, prompt)
        for layout in LAYOUTS
        for round_ in [
            *range(FULL.saving_rounds * FULL.saving_sessions),
            *(warm_round(s) for s in range(FULL.saving_sessions)),
        ]
        for prompt in range(FULL.noreuse_prompts)
    ]
    assert len(set(seeds)) == len(seeds)
    assert min(seeds) > 10_000  # above every other workload's seeds


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown layout 'x'"):
        saving_rounds(TurnTakingRunner({}), "x", 2)
