"""Two engines side by side take turns; results come back per turn, in round order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.turns import WAIT_S, _script, take_turns, turn_order
from tests.support.turn_runner import TurnTakingRunner


def test_turns_alternate_which_engine_goes_first() -> None:
    assert turn_order(3, ("a", "b")) == [
        ("a", 0),
        ("b", 0),
        ("b", 1),
        ("a", 1),
        ("a", 2),
        ("b", 2),
    ]


def _gen(tag: str) -> dict[str, Any]:
    return {"op": "generate", "prompts": [[tag]]}


def test_engines_take_their_turns_one_after_the_other() -> None:
    runner = TurnTakingRunner({"a": 1.0, "b": 2.0})
    result = take_turns(
        runner,
        ("a", "b"),
        lambda config: [_gen(f"{config}-prelude")],
        lambda config, round_: [
            _gen(f"{config}{round_}x"),
            {"op": "sleep"},
            _gen(f"{config}{round_}y"),
        ],
        3,
        0.0,
    )
    turns = [tag for _, prompts in runner.log if "prelude" not in (tag := prompts[0][0])]
    assert turns == [
        "a0x",
        "a0y",
        "b0x",
        "b0y",
        "b1x",
        "b1y",
        "a1x",
        "a1y",
        "a2x",
        "a2y",
        "b2x",
        "b2y",
    ]
    assert set(result) == {"a", "b"}
    a_turns = result["a"]
    assert not isinstance(a_turns, str)
    assert [[g["seconds"] for g in t] for t in a_turns] == [[1.0, 1.0]] * 3


def test_a_failing_engine_is_its_error_and_the_other_does_not_wait_for_it() -> None:
    runner = TurnTakingRunner({"a": 1.0}, fail="b")
    result = take_turns(
        runner,
        ("a", "b"),
        lambda _: [],
        lambda config, round_: [_gen(f"{config}{round_}")],
        3,
        0.0,
    )
    assert isinstance(result["b"], str) and "boom" in result["b"]
    assert result["a"] != "" and len(result["a"]) == 3


def test_no_engine_ends_before_the_last_turn(tmp_path: Path) -> None:
    order = turn_order(2, ("a", "b"))  # the last turn is a's
    steps, spans = _script("b", "a", [], lambda c, n: [_gen(f"{c}{n}")], order, tmp_path, 0.0)
    assert steps[-1] == {"op": "wait_file", "path": str(tmp_path / "turn-3"), "timeout": WAIT_S}
    assert [steps[i]["prompts"] for span in spans for i in span] == [[["b0"]], [["b1"]]]
