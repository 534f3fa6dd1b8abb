"""KV-connector stats of both connectors, and MuxConnector's Prometheus series per child."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

__all__ = ["GAUGES", "MuxConnectorStats", "MuxPromMetrics", "StoreConnectorStats"]

GAUGES = frozenset({"breaker_open"})  # maxed, not summed, across workers and intervals


def _merge(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    merged = dict(mine)
    for key, value in theirs.items():
        if isinstance(value, dict):
            merged[key] = _merge(merged.get(key, {}), value)
        elif key in GAUGES:
            merged[key] = max(merged.get(key, 0), value)
        elif isinstance(value, int | float):
            merged[key] = merged.get(key, 0) + value
    return merged


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, int | float]:
    flat: dict[str, int | float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        elif isinstance(value, int | float):
            flat[name] = value
    return flat


@dataclass
class StoreConnectorStats(KVConnectorStats):
    """One tier's counters for an interval (see kvmux.metrics.TierStats)."""

    def reset(self) -> None:
        """Clear the interval."""
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Sum counters of several workers."""
        self.data = _merge(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        """The interval's counters."""
        return _flatten(self.data)

    def is_empty(self) -> bool:
        """True when nothing moved."""
        flat = _flatten(self.data).items()
        return not any(v for k, v in flat if k.rsplit(".", 1)[-1] not in GAUGES)


@dataclass
class MuxConnectorStats(StoreConnectorStats):
    """``data`` maps each child's label ("0:memory", "1:ExampleConnector") to its counters."""


class MuxPromMetrics(KVConnectorPromMetrics):
    """``kvmux_mux_<counter>_total{child="0:memory"}`` counters and a breaker gauge."""

    COUNTERS = (
        "lookups",
        "hit_tokens",
        "errors",
        "load_errors",
        "save_errors",
        "skipped_calls",
        "load_seconds",
        "save_seconds",
    )

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        children: list[str],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        names = [*labelnames, "child"]
        counter_cls: Any = self._counter_cls
        gauge_cls: Any = self._gauge_cls
        self._counters: dict[str, Any] = {
            name: counter_cls(
                name=f"kvmux_mux_{name}_total",
                documentation=f"kvmux MuxConnector {name}",
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

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        """Add one interval's per-child counters."""
        base = [str(v) for v in self.per_engine_labelvalues.get(engine_idx, [])]
        for child, counters in transfer_stats_data.items():
            if not isinstance(counters, dict):
                continue
            labels = [*base, child]
            for name, metric in self._counters.items():
                value = counters.get(name, 0)
                if value:
                    metric.labels(*labels).inc(value)
            self._breaker.labels(*labels).set(counters.get("breaker_open", 0))
