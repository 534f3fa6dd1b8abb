"""Call a child hook so that an exception becomes a logged, counted default.

MuxConnector's hot hooks call children in plain loops (``try`` costs nothing until a child
raises) and come here only for the rare cases: a failure (``fail``) or a breaker that is
not closed (``invoke``, which skips the call or makes the half-open trial).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from kvmux.policies.breaker import CircuitBreaker

__all__ = ["NOTABLE", "ChildGuard", "Notices", "succeeded"]

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
_ZEROS = dict.fromkeys(_COUNTERS, 0.0)
NOTABLE = frozenset({"load_errors", "save_errors", "errors", "skipped_calls"})  # reported at once


def succeeded(fn: Callable[..., object], *args: object) -> Callable[[], bool]:
    """A call of ``fn(*args)`` that returns True once it returned at all."""

    def run() -> bool:
        fn(*args)
        return True

    return run


class Notices:
    """Whether something to report at once (a NOTABLE counter moved, a breaker opened or
    closed) happened to any of the guards sharing it since the last report."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = False


class ChildGuard:
    """Breaker, counters and once-per-burst logging of one child."""

    def __init__(self, label: str, breaker: CircuitBreaker, notices: Notices | None = None):
        self.label = label
        self.breaker = breaker
        self.lifetime: dict[str, float] = defaultdict(float)  # closed intervals, added up
        self.counters: dict[str, float] = defaultdict(float)  # the rarer ones, by name
        # the ones counted on every lookup, hit, load or save: plain attributes, cheaper
        self.lookups = 0.0  # times the child was asked for a request
        self.hit_tokens = 0.0  # tokens the child was chosen to load
        self.load_seconds = 0.0  # time spent in the child's load hooks
        self.save_seconds = 0.0  # time spent in the child's save hooks
        self.notices = notices or Notices()  # shared by the guards of one connector
        # the breaker is closed (no failure pending): read on every call, so a plain
        # attribute; the breaker changes state only through this guard
        self.closed = breaker.is_closed
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
        return not self.closed and not self.breaker.allow()

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
        if not always and not self.closed and not breaker.allow():
            self.note("skipped_calls")
            return default
        started = time.perf_counter() if timer is not None else 0.0
        try:
            result = method(*args, **kwargs) if kwargs else method(*args)
        except Exception as exc:
            self.fail(hook, exc)
            return default
        finally:
            if timer is not None:  # "load_seconds" or "save_seconds"
                setattr(self, timer, getattr(self, timer) + time.perf_counter() - started)
        if not always and not self.closed:  # the half-open trial call succeeded
            log.warning("kvmux mux: child %s recovered, breaker closed", self.label)
            self._logged_hooks.clear()
            breaker.record_success()
            self.closed = True
            self.notices.pending = True
        return result

    def note(self, counter: str, value: float = 1.0) -> None:
        """Count a NOTABLE event (an error, a skipped call, a lost load or save)."""
        assert counter in NOTABLE, counter
        self.counters[counter] += value
        self.notices.pending = True

    def fail(self, hook: str, exc: BaseException) -> None:
        """Count a failure, open the breaker, log once per burst and hook."""
        self.note("errors")
        self.breaker.record_failure()
        self.closed = False
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

    def force_open(self, seconds: float | None = None) -> None:
        """Open the breaker because the other side of the connector saw the child fail."""
        self.breaker.force_open(seconds)
        self.closed = False
        self.notices.pending = True

    def moved(self) -> bool:
        """Whether a counter moved or the breaker tripped in this interval."""
        return bool(
            self.lookups
            or self.hit_tokens
            or self.load_seconds
            or self.save_seconds
            or self.counters
            or self.breaker.trips != self._reported_trips
        )

    def snapshot(self) -> dict[str, float | str]:
        """Counters plus the breaker's state."""
        data: dict[str, float | str] = dict(_ZEROS)
        data.update(self.counters)
        data["lookups"] = self.lookups
        data["hit_tokens"] = self.hit_tokens
        data["load_seconds"] = self.load_seconds
        data["save_seconds"] = self.save_seconds
        data["breaker_trips"] = float(self.breaker.trips - self._reported_trips)
        data["breaker_open"] = 0.0 if self.breaker.is_closed else 1.0
        return data

    def reset_counters(self) -> None:
        """Start a new stats interval."""
        lifetime = self.lifetime
        if self.counters:
            for name, value in self.counters.items():
                lifetime[name] += value
            self.counters.clear()
        lifetime["lookups"] += self.lookups
        lifetime["hit_tokens"] += self.hit_tokens
        lifetime["load_seconds"] += self.load_seconds
        lifetime["save_seconds"] += self.save_seconds
        self.lookups = self.hit_tokens = self.load_seconds = self.save_seconds = 0.0
        self._reported_trips = self.breaker.trips

    def take_interval(self) -> dict[str, float | str]:
        """This interval's ``snapshot``; a new interval starts."""
        data = self.snapshot()
        self.reset_counters()
        return data

    def _current(self) -> dict[str, float]:
        """This interval's counters, the attribute ones included."""
        return {
            **self.counters,
            "lookups": self.lookups,
            "hit_tokens": self.hit_tokens,
            "load_seconds": self.load_seconds,
            "save_seconds": self.save_seconds,
        }

    def totals(self) -> dict[str, float]:
        """Counters since the guard was made, plus the breaker's trips and state."""
        totals = dict(self.lifetime)
        for name, value in self._current().items():
            totals[name] = totals.get(name, 0.0) + value
        totals["breaker_trips"] = float(self.breaker.trips)
        totals["breaker_open"] = 0.0 if self.breaker.is_closed else 1.0
        return totals
