"""Call a child hook so that an exception becomes a logged, counted default."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from kvmux.policies.breaker import CircuitBreaker

__all__ = ["ChildGuard", "succeeded"]

log = logging.getLogger("kvmux.mux")
T = TypeVar("T")
_COUNTERS = (
    "lookups",
    "hit_tokens",
    "load_errors",
    "save_errors",
    "errors",
    "skipped_calls",
    "load_seconds",
    "save_seconds",
)


def succeeded(fn: Callable[..., object], *args: object) -> Callable[[], bool]:
    """A call of ``fn(*args)`` that returns True once it returned at all."""

    def run() -> bool:
        fn(*args)
        return True

    return run


class ChildGuard:
    """Breaker, counters and once-per-burst logging of one child."""

    def __init__(self, label: str, breaker: CircuitBreaker):
        self.label = label
        self.breaker = breaker
        self.lifetime: dict[str, float] = defaultdict(float)  # closed intervals, added up
        self.counters: dict[str, float] = defaultdict(float)
        self._logged_hooks: set[str] = set()
        self._reported_trips = 0  # breaker trips already counted in an earlier interval

    def call(
        self,
        hook: str,
        fn: Callable[[], T],
        default: T,
        timer: str | None = None,
        always: bool = False,
    ) -> T:
        """Run ``fn``; on an exception (or an open breaker, unless ``always``) ``default``."""
        return self.invoke(hook, fn, (), default, timer, always=always)

    def cut_off(self) -> bool:
        """Whether the child's data path is cut off now (breaker open, not yet half-open)."""
        return not self.breaker.is_closed and not self.breaker.allow()

    def invoke(
        self,
        hook: str,
        method: Callable[..., T],
        args: tuple[Any, ...],
        default: T,
        timer: str | None = None,
        kwargs: dict[str, Any] | None = None,
        always: bool = False,
    ) -> T:
        """``method(*args, **kwargs)``; on an exception return ``default``.

        An open breaker skips data-path hooks (lookups, loads, saves). Lifecycle and
        completion hooks pass ``always``: they run whatever the breaker says, since
        skipping them would leak the child's state or misreport its transfers.
        """
        breaker = self.breaker
        if not always and not breaker.is_closed and not breaker.allow():
            self.counters["skipped_calls"] += 1
            return default
        started = time.perf_counter() if timer is not None else 0.0
        try:
            result = method(*args, **kwargs) if kwargs else method(*args)
        except Exception as exc:
            self.fail(hook, exc)
            return default
        finally:
            if timer is not None:
                self.counters[timer] += time.perf_counter() - started
        if not always and not breaker.is_closed:  # the half-open trial call succeeded
            log.warning("kvmux mux: child %s recovered, breaker closed", self.label)
            self._logged_hooks.clear()
            breaker.record_success()
        return result

    def fail(self, hook: str, exc: BaseException) -> None:
        """Count a failure, open the breaker, log once per burst and hook."""
        self.counters["errors"] += 1
        self.breaker.record_failure()
        if hook not in self._logged_hooks:
            self._logged_hooks.add(hook)
            log.error(
                "kvmux mux: child %s failed in %s (%s: %s); skipping it for a while",
                self.label,
                hook,
                type(exc).__name__,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )

    def snapshot(self) -> dict[str, float | str]:
        """Counters plus the breaker's state."""
        data: dict[str, float | str] = {name: self.counters.get(name, 0.0) for name in _COUNTERS}
        data["breaker_trips"] = float(self.breaker.trips - self._reported_trips)
        data["breaker_open"] = 0.0 if self.breaker.state == "closed" else 1.0
        return data

    def reset_counters(self) -> None:
        """Start a new stats interval."""
        for name, value in self.counters.items():
            self.lifetime[name] += value
        self.counters.clear()
        self._reported_trips = self.breaker.trips

    def totals(self) -> dict[str, float]:
        """Counters since the guard was made, plus the breaker's trips and state."""
        totals = dict(self.lifetime)
        for name, value in self.counters.items():
            totals[name] = totals.get(name, 0.0) + value
        totals["breaker_trips"] = float(self.breaker.trips)
        totals["breaker_open"] = 0.0 if self.breaker.state == "closed" else 1.0
        return totals
