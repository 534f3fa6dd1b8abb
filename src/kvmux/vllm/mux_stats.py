"""MuxConnector's stats of an interval: each child's own, and the mux's counters per child."""

from __future__ import annotations

import logging
import time

from kvmux.mux.roster import Roster
from kvmux.vllm.stats import MUX_COUNTERS, MuxConnectorStats, MuxCounterStats

__all__ = ["COUNTERS_SECONDS", "STATS_LOG_SECONDS", "MuxStatsReporter"]

log = logging.getLogger("kvmux.mux")
# the mux's own counters go out at most this often (at once after an error, a breaker
# change or a finished request, so an engine going idle has reported them all); they are
# exact, only reported later. Children's own stats go out every step.
COUNTERS_SECONDS = 1.0
STATS_LOG_SECONDS = 60.0


class MuxStatsReporter:
    """What one side of a MuxConnector reports to vLLM, interval by interval."""

    def __init__(self, roster: Roster):
        self.roster = roster
        self._last_log = time.monotonic()
        self._counters_due = 0.0  # when the mux's own counters are next reported

    def take(self) -> MuxConnectorStats | None:
        """Each child's own stats of this interval under its label, and the mux's counters
        of every child (at most every ``COUNTERS_SECONDS``, and at once after an error, a
        breaker change, or the finish of the last running request)."""
        stats: MuxConnectorStats | None = None
        for member in self.roster.members:
            try:
                child_stats = member.connector.get_kv_connector_stats()
            except Exception as exc:
                member.guard.fail("get_kv_connector_stats", exc)
                continue
            if child_stats is None:
                continue
            stats = stats or MuxConnectorStats()
            stats.data[member.label] = child_stats
            stats.connectors[member.label] = member.path
        now = time.monotonic()
        if now >= self._counters_due or self.roster.notices.pending:
            self._counters_due = now + COUNTERS_SECONDS
            stats = self._add_counters(stats, now)
        return stats

    def _add_counters(
        self, stats: MuxConnectorStats | None, now: float
    ) -> MuxConnectorStats | None:
        """``stats`` with the mux's counters of the interval, unless nothing moved."""
        self.roster.notices.pending = False
        guards = self.roster.guards
        if stats is None and not any(guard.moved() for guard in guards):
            return None
        own = MuxCounterStats(data={guard.label: guard.take_interval() for guard in guards})
        stats = stats or MuxConnectorStats()
        stats.data[MUX_COUNTERS] = own
        if now - self._last_log >= STATS_LOG_SECONDS and not stats.is_empty():
            self._last_log = now
            log.info("kvmux mux stats: %s", stats.reduce())
        return stats

    def totals(self) -> dict[str, dict[str, float]]:
        """Each child's counters since start, by label, as this side of the mux saw them."""
        return {guard.label: guard.totals() for guard in self.roster.guards}
