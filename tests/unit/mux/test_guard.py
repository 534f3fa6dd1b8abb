"""kvmux.mux.guard: one child's breaker, counters and what must be reported at once."""

from __future__ import annotations

import pytest

from kvmux.mux.guard import ChildGuard, Notices
from kvmux.policies.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def boom() -> None:
    raise RuntimeError("boom")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def guard(clock: Clock, notices: Notices | None = None) -> ChildGuard:
    return ChildGuard("0:child", CircuitBreaker(1.0, 8.0, clock=clock), notices)


def test_closed_follows_the_breaker_through_failure_and_recovery(clock: Clock) -> None:
    g = guard(clock)
    assert g.closed and g.breaker.is_closed
    assert g.invoke("hook", boom, (), "miss") == "miss"
    assert not g.closed and not g.breaker.is_closed
    assert g.invoke("hook", lambda: "hit", (), "miss") == "miss"  # open: skipped
    clock.now += 1.0
    assert g.invoke("hook", lambda: "hit", (), "miss") == "hit"  # the half-open trial
    assert g.closed and g.breaker.is_closed
    g.force_open(2.0)
    assert not g.closed and g.cut_off()


def test_guards_sharing_notices_raise_them_on_what_must_be_reported(clock: Clock) -> None:
    notices = Notices()
    a, b = guard(clock, notices), guard(clock, notices)
    a.lookups += 3  # counted, but nothing to report at once
    assert not notices.pending
    b.note("save_errors")
    assert notices.pending
    notices.pending = False
    a.force_open()
    assert notices.pending


def test_counters_are_exact_across_intervals(clock: Clock) -> None:
    g = guard(clock)
    g.lookups += 2
    g.hit_tokens += 32
    g.save_seconds += 0.5
    g.invoke("hook", boom, (), None)
    first = g.snapshot()
    g.reset_counters()
    g.lookups += 1
    second = g.snapshot()
    assert (first["lookups"], first["hit_tokens"], first["errors"]) == (2.0, 32.0, 1.0)
    assert (second["lookups"], second["errors"], second["breaker_trips"]) == (1.0, 0.0, 0.0)
    totals = g.totals()
    assert (totals["lookups"], totals["hit_tokens"], totals["save_seconds"]) == (3.0, 32.0, 0.5)
    assert totals["errors"] == 1.0 and totals["breaker_trips"] == 1.0
