"""A circuit breaker per child: open after a failure, closed again by itself."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Skips a failing child for a back-off that doubles per consecutive failure.

    After the back-off one trial call is let through (half-open); a success closes the
    breaker, a failure opens it again for twice as long, up to ``max_seconds``.
    """

    def __init__(
        self,
        base_seconds: float = 5.0,
        max_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._base = base_seconds
        self._max = max_seconds
        self._clock = clock
        self._failures = 0
        self._open_until = 0.0
        self.trips = 0  # how many times the breaker opened

    @property
    def is_closed(self) -> bool:
        """True when no failure is pending: the fast path of every call."""
        return self._failures == 0

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``."""
        if self._failures == 0:
            return "closed"
        return "open" if self._clock() < self._open_until else "half-open"

    def allow(self) -> bool:
        """Whether the child may be called now."""
        return self.state != "open"

    def record_failure(self) -> None:
        """A call failed: open (again) for the next back-off."""
        backoff = min(self._max, self._base * 2**self._failures)
        self._failures += 1
        self._open_until = self._clock() + backoff
        self.trips += 1

    def record_success(self) -> None:
        """A call succeeded: close."""
        self._failures = 0
        self._open_until = 0.0

    def force_open(self, seconds: float | None = None) -> None:
        """Open because the other side of the connector saw the child fail."""
        if self.state != "open":
            self._failures = max(self._failures, 1)
            self.trips += 1
        self._open_until = max(self._open_until, self._clock() + (seconds or self._base))
