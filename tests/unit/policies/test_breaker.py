"""kvmux.policies.breaker: closed, open, half-open with a fake clock."""

from __future__ import annotations

import pytest

from kvmux.policies.breaker import CircuitBreaker


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def breaker(clock: Clock, base: float = 1.0, most: float = 8.0) -> CircuitBreaker:
    return CircuitBreaker(base_seconds=base, max_seconds=most, clock=clock)


def test_starts_closed(clock: Clock) -> None:
    b = breaker(clock)
    assert b.state == "closed"
    assert b.allow()
    assert b.trips == 0


def test_failure_opens_then_half_opens_then_success_closes(clock: Clock) -> None:
    b = breaker(clock, base=2.0)
    b.record_failure()
    assert b.state == "open"
    assert not b.allow()
    assert b.trips == 1
    clock.advance(1.999)
    assert not b.allow()
    clock.advance(0.001)
    assert b.state == "half-open"
    assert b.allow()
    b.record_success()
    assert b.state == "closed"
    assert b.allow()
    assert b.trips == 1


def backoffs(b: CircuitBreaker, clock: Clock, failures: int) -> list[float]:
    """Fail from half-open ``failures`` times; measure each back-off."""
    seen = []
    for _ in range(failures):
        b.record_failure()
        opened = clock.now
        step = 0.25
        while not b.allow():
            clock.advance(step)
        seen.append(clock.now - opened)
        assert b.state == "half-open"
    return seen


def test_repeated_failures_double_the_backoff_up_to_max(clock: Clock) -> None:
    b = breaker(clock, base=1.0, most=5.0)
    assert backoffs(b, clock, 5) == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.trips == 5


def test_success_resets_the_backoff(clock: Clock) -> None:
    b = breaker(clock, base=1.0, most=8.0)
    assert backoffs(b, clock, 3) == [1.0, 2.0, 4.0]
    b.record_success()
    assert backoffs(b, clock, 1) == [1.0]


def test_success_while_closed_is_harmless(clock: Clock) -> None:
    b = breaker(clock)
    b.record_success()
    assert b.state == "closed"
    assert b.trips == 0


def test_force_open_from_closed(clock: Clock) -> None:
    b = breaker(clock, base=1.0)
    b.force_open(3.0)
    assert b.state == "open"
    assert b.trips == 1
    clock.advance(2.9)
    assert not b.allow()
    clock.advance(0.1)
    assert b.state == "half-open"
    b.record_success()
    assert b.state == "closed"


def test_force_open_defaults_to_the_base_backoff(clock: Clock) -> None:
    b = breaker(clock, base=2.0)
    b.force_open()
    clock.advance(1.5)
    assert not b.allow()
    clock.advance(0.5)
    assert b.allow()


def test_force_open_while_open_extends_but_never_shortens(clock: Clock) -> None:
    b = breaker(clock, base=4.0)
    b.record_failure()  # open until +4
    b.force_open(1.0)
    clock.advance(3.0)
    assert not b.allow()  # the shorter force_open did not shorten it
    b.force_open(2.0)  # open until +5
    clock.advance(1.5)
    assert not b.allow()
    clock.advance(0.5)
    assert b.allow()
    assert b.trips == 1  # already open: not a new trip


def test_failure_after_force_open_doubles(clock: Clock) -> None:
    b = breaker(clock, base=1.0, most=8.0)
    b.force_open()
    clock.advance(1.0)
    assert backoffs(b, clock, 1) == [2.0]


def test_force_open_from_half_open_counts_a_trip(clock: Clock) -> None:
    b = breaker(clock, base=1.0)
    b.record_failure()
    clock.advance(1.0)
    assert b.state == "half-open"
    b.force_open()
    assert b.state == "open"
    assert b.trips == 2
