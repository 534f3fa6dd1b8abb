"""MuxConnector's Prometheus metrics: one series per child label."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvmux.vllm.stats import MuxConnectorStats, MuxPromMetrics


def test_counters_and_breaker_gauge_per_child() -> None:
    registry = CollectorRegistry()
    types = {cls: partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}
    prom = MuxPromMetrics(
        SimpleNamespace(kv_transfer_config=None),
        types,
        ["model_name", "engine"],
        {0: ["m", "0"]},
        ["0:memory", "1:memory"],
    )
    stats = MuxConnectorStats(data={"0:memory": {"lookups": 3, "breaker_open": 0.0}})
    stats.aggregate(
        MuxConnectorStats(
            data={"0:memory": {"lookups": 1}, "1:memory": {"errors": 2, "breaker_open": 1.0}}
        )
    )
    prom.observe(stats.data, 0)
    text = generate_latest(registry).decode()
    assert 'kvmux_mux_lookups_total{child="0:memory",engine="0",model_name="m"} 4.0' in text
    assert 'kvmux_mux_errors_total{child="1:memory",engine="0",model_name="m"} 2.0' in text
    assert 'kvmux_mux_breaker_open{child="1:memory",engine="0",model_name="m"} 1.0' in text
    assert 'kvmux_mux_breaker_open{child="0:memory",engine="0",model_name="m"} 0.0' in text
