"""Workload (c): engines with and without kvmux take turns, and the cost per round."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvmux.tools.bench import saving
from kvmux.tools.bench.bars import evaluate_bars
from kvmux.tools.bench.profiles import FULL, QUICK
from kvmux.tools.bench.saving import (
    LAYOUTS,
    WARM_ROUND,
    noreuse_seed,
    round_costs,
    saving_rounds,
    turn_order,
)


class TurnTakingRunner:
    """Plays each engine's script for real (files touched and waited for), in threads.

    A generate answers ``seconds[config]``; ``log`` records who generated in what order.
    """

    def __init__(self, seconds: dict[str, float], fail: str | None = None):
        self.plan = replace(QUICK, noreuse_prompts=2, noreuse_tokens=4, noreuse_max_tokens=1)
        self.seconds = seconds
        self.fail = fail
        self.log: list[tuple[str, list[list[int]]]] = []
        self.lock = threading.Lock()

    def tokens(self, seed: int, count: int) -> list[int]:
        return [seed] * count

    def run(self, config: str, steps: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        if config == self.fail:
            raise RuntimeError("engine job exited with 1: boom")
        done: list[dict[str, Any]] = [{"op": "generate", "seconds": 9.0}]  # the warm-up
        for step in steps:
            if step["op"] == "wait_file":
                deadline = time.monotonic() + 10
                while not Path(step["path"]).exists():
                    assert time.monotonic() < deadline, f"{config} waited in vain"
                    time.sleep(0.005)
            elif step["op"] == "touch":
                Path(step["path"]).touch()
            elif step["op"] == "generate":
                with self.lock:
                    self.log.append((config, step["prompts"]))
                done.append({"op": "generate", "seconds": self.seconds[config]})
                continue
            done.append({"op": step["op"]})
        return {"steps": done}


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saving, "PAUSE_S", 0.0)


def test_turns_alternate_which_engine_goes_first() -> None:
    assert turn_order(3, ("a", "b")) == [
        ("a", 0),
        ("b", 0),
        ("b", 1),
        ("a", 1),
        ("a", 2),
        ("b", 2),
    ]


def test_engines_take_their_turns_one_after_the_other() -> None:
    runner = TurnTakingRunner({"none": 2.0, "kvmux-mux-redis": 2.5})
    rows = saving_rounds(runner, "multi-process", 4)  # type: ignore[arg-type]
    measured = [(c, p[0][0]) for c, p in runner.log if p[0][0] // 100 % 1000 != WARM_ROUND]
    expected = [
        (config, noreuse_seed("multi-process", round_, 0)) for config, round_ in turn_order(4)
    ]
    assert measured == expected
    assert [(r["config"], r["round"]) for r in rows] == [
        (c, r) for c in saving.SAVING_CONFIGS for r in range(4)
    ]
    tokens = runner.plan.noreuse_prompts * 5
    assert rows[0]["throughput_tok_s"] == pytest.approx(tokens / 2.0)
    assert round_costs(rows, "kvmux-mux-redis", "multi-process") == pytest.approx([0.2] * 4)


def test_a_failing_engine_is_an_error_row_and_the_other_does_not_wait_for_it() -> None:
    runner = TurnTakingRunner({"none": 1.0}, fail="kvmux-mux-redis")
    rows = saving_rounds(runner, "in-process", 3)  # type: ignore[arg-type]
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
        for round_ in [*range(FULL.saving_rounds), WARM_ROUND]
        for prompt in range(FULL.noreuse_prompts)
    ]
    assert len(set(seeds)) == len(seeds)
    assert min(seeds) > 10_000  # above every other workload's seeds


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown layout 'x'"):
        saving_rounds(TurnTakingRunner({}), "x", 2)  # type: ignore[arg-type]
