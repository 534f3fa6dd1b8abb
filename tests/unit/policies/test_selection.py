"""kvmux.policies: which children load which range, per policy (built by name)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from itertools import pairwise

import pytest

from kvmux.errors import ConfigError
from kvmux.policies import registry
from kvmux.policies.registry import make_policy
from kvmux.policies.selection import Contribution, Offer

# per child: {start: tokens, or (tokens, is_async), or None}; "*" answers any start
Script = Mapping[object, int | tuple[int, bool] | None]


class Asker:
    """A scripted ``ask`` that records every (child, start) it is asked."""

    def __init__(self, *scripts: Script):
        self.scripts = scripts
        self.asked: list[tuple[int, int]] = []

    def __call__(self, child: int, start: int) -> Offer | None:
        self.asked.append((child, start))
        script = self.scripts[child]
        answer = script[start] if start in script else script.get("*", 0)
        if answer is None:
            return None
        tokens, is_async = answer if isinstance(answer, tuple) else (answer, False)
        return Offer(start, tokens, is_async)


def run(
    policy: str,
    *scripts: Script,
    start: int = 0,
    capable: Sequence[bool] | None = None,
    block_size: int = 8,
) -> tuple[list[Contribution] | None, Asker]:
    ask = Asker(*scripts)
    offset_capable = [True] * len(scripts) if capable is None else list(capable)
    return make_policy(policy).select(ask, offset_capable, start, block_size), ask


def any_start(answer: int | tuple[int, bool] | None) -> Script:
    return {"*": answer}


# -- first ----------------------------------------------------------------------------


def test_first_takes_the_first_child_with_tokens_and_asks_all() -> None:
    plan, ask = run("first", any_start(0), any_start(32), any_start(64), start=16)
    assert plan == [Contribution(1, 16, 32, False)]
    assert ask.asked == [(0, 16), (1, 16), (2, 16)]


def test_first_earliest_wins_even_if_shorter() -> None:
    plan, _ = run("first", any_start(16), any_start(128))
    assert plan == [Contribution(0, 0, 16, False)]


def test_first_keeps_the_async_flag() -> None:
    plan, _ = run("first", any_start((48, True)), any_start(0))
    assert plan == [Contribution(0, 0, 48, True)]


def test_first_nothing_offered() -> None:
    plan, ask = run("first", any_start(0), any_start(0))
    assert plan == []
    assert len(ask.asked) == 2


def test_first_ignores_offset_capability() -> None:
    plan, _ = run("first", any_start(0), any_start(32), start=16, capable=[False, False])
    assert plan == [Contribution(1, 16, 32, False)]


@pytest.mark.parametrize("looking", [0, 1, 2])
def test_first_none_while_any_child_looks(looking: int) -> None:
    scripts = [any_start(32), any_start(16), any_start(0)]
    scripts[looking] = any_start(None)
    plan, ask = run("first", *scripts)
    assert plan is None
    assert [c for c, _ in ask.asked] == [0, 1, 2]


# -- longest --------------------------------------------------------------------------


def test_longest_takes_the_most_tokens() -> None:
    plan, ask = run("longest", any_start(16), any_start(64), any_start(32), start=32)
    assert plan == [Contribution(1, 32, 64, False)]
    assert ask.asked == [(0, 32), (1, 32), (2, 32)]


def test_longest_ties_go_to_the_earliest() -> None:
    plan, _ = run("longest", any_start(16), any_start((64, True)), any_start(64))
    assert plan == [Contribution(1, 0, 64, True)]


def test_longest_nothing_offered() -> None:
    plan, _ = run("longest", any_start(0), any_start(0))
    assert plan == []


@pytest.mark.parametrize("looking", [0, 1])
def test_longest_none_while_any_child_looks(looking: int) -> None:
    scripts = [any_start(32), any_start(64)]
    scripts[looking] = any_start(None)
    plan, _ = run("longest", *scripts)
    assert plan is None


# -- compose --------------------------------------------------------------------------


def test_compose_asks_each_child_from_where_the_previous_stopped() -> None:
    plan, ask = run("compose", {16: 32}, {48: 16}, {64: (32, True)}, start=16)
    assert plan == [
        Contribution(0, 16, 32, False),
        Contribution(1, 48, 16, False),
        Contribution(2, 64, 32, True),
    ]
    assert ask.asked == [(0, 16), (1, 48), (2, 64)]


def test_compose_contributions_are_contiguous() -> None:
    plan, _ = run("compose", {0: 16}, {16: 0}, {16: 48}, {64: 16})
    assert plan is not None
    assert [c.child for c in plan] == [0, 2, 3]
    assert plan[0].start == 0
    for before, after in pairwise(plan):
        assert before.end == after.start
    assert plan[-1].end == 80


def test_compose_skips_a_child_that_cannot_load_past_the_computed_tokens() -> None:
    plan, ask = run("compose", {0: 32}, {"*": 99}, {32: 16}, capable=[True, False, True])
    assert plan == [Contribution(0, 0, 32, False), Contribution(2, 32, 16, False)]
    assert ask.asked == [(0, 0), (2, 32)]


def test_compose_asks_an_offset_incapable_child_at_the_start() -> None:
    plan, ask = run("compose", {8: 0}, {8: 24}, {32: 8}, start=8, capable=[True, False, True])
    assert plan == [Contribution(1, 8, 24, False), Contribution(2, 32, 8, False)]
    assert ask.asked == [(0, 8), (1, 8), (2, 32)]


def test_compose_first_child_incapable_is_still_asked() -> None:
    plan, ask = run("compose", {0: 16}, {16: 16}, capable=[False, True])
    assert plan == [Contribution(0, 0, 16, False), Contribution(1, 16, 16, False)]
    assert ask.asked == [(0, 0), (1, 16)]


def test_compose_nothing_offered() -> None:
    plan, ask = run("compose", any_start(0), any_start(0))
    assert plan == []
    assert ask.asked == [(0, 0), (1, 0)]


@pytest.mark.parametrize("looking", [0, 1, 2])
def test_compose_none_from_an_asked_child(looking: int) -> None:
    scripts: list[Script] = [{0: 16}, {16: 16}, {32: 16}]
    scripts[looking] = any_start(None)
    plan, ask = run("compose", *scripts)
    assert plan is None
    assert ask.asked[-1][0] == looking  # nobody after the looking child is asked


def test_compose_none_from_a_skipped_child_does_not_matter() -> None:
    plan, ask = run("compose", {0: 16}, any_start(None), capable=[True, False])
    assert plan == [Contribution(0, 0, 16, False)]
    assert ask.asked == [(0, 0)]


# -- misc -----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["first", "longest", "compose"])
def test_no_children(policy: str) -> None:
    plan, ask = run(policy)
    assert plan == []
    assert ask.asked == []


def test_unknown_policy_names_the_key_and_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="fastest") as raised:
        make_policy("fastest")
    assert raised.value.key == "policy"
    assert raised.value.accepted == "compose, first, longest"


def test_a_registered_policy_is_imported_only_when_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    registry.register_policy("last", "tests.unit.policies.last_policy", "Last")
    assert "tests.unit.policies.last_policy" not in sys.modules
    assert "last" in registry.policy_names()
    plan, _ = run("last", any_start(8), any_start(16))
    assert plan == [Contribution(1, 0, 16, False)]
    with pytest.raises(ValueError, match="already"):
        registry.register_policy("last", "elsewhere", "Other")
    registry.register_policy("typo", "kvmux.policies.selection", "Composee")
    with pytest.raises(ConfigError, match="cannot be loaded") as raised:
        make_policy("typo")
    assert raised.value.key == "policy"


def test_contribution_end() -> None:
    assert Contribution(0, 16, 32, False).end == 48


def test_compose_stops_where_a_child_ends_off_a_block_boundary() -> None:
    """Aligned, or nothing: a later child never starts inside a block."""
    plan, ask = run("compose", {0: 100}, {"*": 64}, block_size=16)
    assert plan == [Contribution(0, 0, 100, False)]
    assert ask.asked == [(0, 0)]


def test_compose_goes_on_from_an_aligned_end() -> None:
    plan, ask = run("compose", {0: 96}, {96: 64}, block_size=16)
    assert plan == [Contribution(0, 0, 96, False), Contribution(1, 96, 64, False)]
    assert ask.asked == [(0, 0), (1, 96)]
