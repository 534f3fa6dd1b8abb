"""Workload (c): engines with and without kvmux take turns, and the cost per round."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import saving
from benchmarks.bars import evaluate_bars
from benchmarks.profiles import FULL
from benchmarks.saving import (
    LAYOUTS,
    WARM_ROUND,
    noreuse_seed,
    pair_costs,
    round_costs,
    saving_rounds,
    warm_round,
)
from benchmarks.turns import turn_order
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
    assert "median of 3 pairs of rounds in both orders, 3 engine pairs" in bar["bar"]


@pytest.mark.parametrize(("rounds", "sessions"), [(0, 1), (2, 0), (40, 3)])
def test_sessions_that_cannot_be_seeded_apart_are_refused(rounds: int, sessions: int) -> None:
    with pytest.raises(ValueError, match="too few or too many"):
        saving_rounds(TurnTakingRunner({}), "multi-process", rounds, sessions=sessions)


def test_an_odd_number_of_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="3 rounds: an even number is needed"):
        saving_rounds(TurnTakingRunner({}), "multi-process", 3)


def test_a_failing_engine_is_an_error_row_and_the_other_does_not_wait_for_it() -> None:
    runner = TurnTakingRunner({"none": 1.0}, fail="kvmux-mux-redis", **SMALL)
    rows = saving_rounds(runner, "in-process", 2)
    errors = [r for r in rows if "error" in r]
    assert [(r["config"], r["layout"]) for r in errors] == [("kvmux-mux-redis", "in-process")]
    assert "boom" in errors[0]["error"]
    assert len([r for r in rows if r["config"] == "none"]) == 2


def _row(config: str, layout: str, session: int, round_: int, tok_s: float) -> dict[str, Any]:
    return {
        "config": config,
        "layout": layout,
        "session": session,
        "round": round_,
        "throughput_tok_s": tok_s,
    }


def test_saving_cost_is_the_median_over_pairs_of_rounds_in_the_default_layout() -> None:
    mp = "multi-process"
    rows = [
        *(_row("none", mp, 0, r, 100.0) for r in range(4)),
        *(_row("kvmux-mux-redis", mp, 0, r, t) for r, t in enumerate([97.0, 80.0, 96.0, 98.0])),
        *(_row("none", mp, 1, r, 100.0) for r in (4, 5)),
        _row("kvmux-mux-redis", mp, 1, 4, 99.0),  # its round 5 is missing: no pair
        _row("none", "in-process", 0, 0, 100.0),
        _row("kvmux-mux-redis", "in-process", 0, 0, 50.0),
        _row("none", "in-process", 0, 1, 100.0),
        _row("kvmux-mux-redis", "in-process", 0, 1, 50.0),
        {"config": "kvmux-mux-redis", "layout": mp, "error": "x"},
    ]
    assert round_costs(rows, "kvmux-mux-redis", mp)[:4] == pytest.approx([0.03, 0.2, 0.04, 0.02])
    expected = [1 - (97.0 * 80.0) ** 0.5 / 100.0, 1 - (96.0 * 98.0) ** 0.5 / 100.0]
    assert pair_costs(rows, "kvmux-mux-redis", mp) == pytest.approx(expected)
    assert pair_costs(rows, "kvmux-mux-redis", "in-process") == pytest.approx([0.5])
    (bar,) = [b for b in evaluate_bars({"no_reuse": rows}) if b["bar"].startswith("saving")]
    assert "multi-process, median of 2 pairs of rounds in both orders, 2 engine pairs" in bar["bar"]
    assert bar["measured"] == pytest.approx(sum(expected) / 2, abs=1e-4)  # rounded
    assert bar["met"] is False


def test_an_engines_lead_in_its_second_turn_in_a_row_cancels_in_a_pair() -> None:
    # same true cost (0.04), each engine 10% faster in the turn after its own
    mp, lead = "multi-process", 1.1
    rows = [
        _row("none", mp, 0, 0, 100.0 * lead),  # round 0: none first (after its warm-up)
        _row("kvmux-mux-redis", mp, 0, 0, 96.0),
        _row("kvmux-mux-redis", mp, 0, 1, 96.0 * lead),  # round 1: kvmux first
        _row("none", mp, 0, 1, 100.0),
    ]
    assert round_costs(rows, "kvmux-mux-redis", mp) == pytest.approx([1 - 0.96 / 1.1, 1 - 1.056])
    assert pair_costs(rows, "kvmux-mux-redis", mp) == pytest.approx([0.04])


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


def test_a_round_lost_on_both_sides_never_pairs_two_rounds_of_one_order() -> None:
    mp = "multi-process"
    rows = [
        *(_row("none", mp, 0, r, 100.0) for r in (0, 2, 3)),
        *(_row("kvmux-mux-redis", mp, 0, r, t) for r, t in ((0, 50.0), (2, 90.0), (3, 90.0))),
    ]
    assert pair_costs(rows, "kvmux-mux-redis", mp) == pytest.approx([0.1])  # rounds 2 and 3
