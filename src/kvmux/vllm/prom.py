"""MuxConnector's Prometheus series: its own counters per child, and each child's own."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from kvmux.metrics import GAUGES, TierStats
from kvmux.vllm.stats import MUX_COUNTERS

__all__ = ["CHILD_LABEL", "TIER_COUNTERS", "MuxPromMetrics", "SharedMetricTypes", "TierPromMetrics"]

TIER_COUNTERS = tuple(
    f.name for f in fields(TierStats) if not f.name.startswith("_") and f.name not in GAUGES
)

CHILD_LABEL = "child"  # the Prometheus label naming a MuxConnector child ("0:memory")


class SharedMetricTypes:
    """vLLM's metric factories, made idempotent by metric name.

    Two children of one class each build the same metrics; Prometheus refuses a name
    registered twice, so the second child gets the first one's metric objects and
    tells its series apart by the child label.
    """

    def __init__(self, metric_types: dict[Any, Any]):
        self._made: dict[tuple[Any, str], Any] = {}
        self.types = {kind: self._factory(make) for kind, make in metric_types.items()}

    def _factory(self, make: Any) -> Any:
        def build(*args: Any, **kwargs: Any) -> Any:
            name = str(kwargs.get("name", args[0] if args else ""))
            if (make, name) not in self._made:
                self._made[make, name] = make(*args, **kwargs)
            return self._made[make, name]

        return build


class MuxPromMetrics(KVConnectorPromMetrics):
    """``kvmux_mux_<counter>_total{child="0:memory"}``, a breaker gauge, and every child's
    own metrics (built by its class, labelled with the child)."""

    COUNTERS = (
        "lookups",
        "hit_tokens",
        "errors",
        "load_errors",
        "save_errors",
        "skipped_calls",
        "breaker_trips",
        "load_seconds",
        "save_seconds",
    )

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        children: dict[str, KVConnectorPromMetrics | None],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        names = [*labelnames, CHILD_LABEL]
        counter_cls: Any = self._counter_cls
        gauge_cls: Any = self._gauge_cls
        self._counters: dict[str, Any] = {
            name: counter_cls(
                name=f"kvmux_mux_{name}_total",
                documentation=f"kvmux MuxConnector {name.replace('_', ' ')} per child",
                labelnames=names,
            )
            for name in self.COUNTERS
        }
        self._breaker = gauge_cls(
            name="kvmux_mux_breaker_open",
            documentation="1 while the child's circuit breaker is open",
            labelnames=names,
            multiprocess_mode="mostrecent",
        )
        self._children = children
        for engine_idx in per_engine_labelvalues:  # every series exists from the start
            for label in children:
                self._observe_counters(label, {}, engine_idx)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        """One interval of ``MuxConnectorStats.to_dict()``: the counters, then each child's."""
        for label, counters in (transfer_stats_data.get(MUX_COUNTERS) or {}).items():
            self._observe_counters(label, counters, engine_idx)
        for label, entry in transfer_stats_data.items():
            child = self._children.get(label)
            if child is not None and isinstance(entry, dict) and entry.get("stats") is not None:
                child.observe(entry["stats"], engine_idx)

    def _observe_counters(self, label: str, counters: dict[str, Any], engine_idx: int) -> None:
        labels = [*(str(v) for v in self.per_engine_labelvalues.get(engine_idx, [])), label]
        for name, metric in self._counters.items():
            series = metric.labels(*labels)
            if counters.get(name):
                series.inc(counters[name])
        self._breaker.labels(*labels).set(counters.get("breaker_open", 0))


class TierPromMetrics(KVConnectorPromMetrics):
    """``kvmux_tier_<counter>_total{tier="disk"}`` for every counter of a tier.

    Every series exists from the start (zeros included), so dashboards show 0, not
    "no data", before the first hit.
    """

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        tier: str,
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter_cls: Any = self._counter_cls
        names = [*labelnames, "tier"]
        self._series: dict[int, dict[str, Any]] = {i: {} for i in per_engine_labelvalues}
        for name in TIER_COUNTERS:
            metric = counter_cls(
                name=f"kvmux_tier_{name}_total",
                documentation=f"kvmux tier {name.replace('_', ' ')}",
                labelnames=names,
            )
            for engine_idx, values in per_engine_labelvalues.items():
                labels = [*(str(v) for v in values), tier]
                self._series[engine_idx][name] = metric.labels(*labels)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        """Add one interval's counters (a StoreConnectorStats payload)."""
        series = self._series.get(engine_idx, {})
        for name, value in transfer_stats_data.items():
            if name in series and isinstance(value, int | float) and value > 0:
                series[name].inc(value)
