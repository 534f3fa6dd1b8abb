"""MuxConnector's Prometheus metrics: its counters per child, and each child's own."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from vllm.config import KVTransferConfig

from kvmux.vllm import MuxConnector
from kvmux.vllm.prom import TIER_COUNTERS, MuxPromMetrics, TierPromMetrics
from tests.unit.vllm import scripted

LABELS = ["model_name", "engine"]


def metric_types(registry: CollectorRegistry) -> dict[Any, Any]:
    return {cls: partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram)}


def child(name: str) -> dict[str, Any]:
    return {
        "kv_connector": "ScriptedConnector",
        "kv_connector_module_path": scripted.MODULE,
        "kv_connector_extra_config": {"name": name},
    }


def test_counters_exist_from_the_start_and_count_per_child() -> None:
    registry = CollectorRegistry()
    prom = MuxPromMetrics(
        SimpleNamespace(kv_transfer_config=None),
        metric_types(registry),
        LABELS,
        {0: ["m", "0"]},
        {"0:memory": None, "1:memory": None},
    )
    text = generate_latest(registry).decode()
    assert 'kvmux_mux_breaker_trips_total{child="1:memory",engine="0",model_name="m"} 0.0' in text
    stats = MuxConnector.build_kv_connector_stats(
        {"mux": {"0:memory": {"lookups": 3, "breaker_open": 0.0}}}
    )
    stats.aggregate(
        MuxConnector.build_kv_connector_stats(
            {"mux": {"0:memory": {"lookups": 1}, "1:memory": {"errors": 2, "breaker_open": 1.0}}}
        )
    )
    prom.observe(stats.to_dict(), 0)
    text = generate_latest(registry).decode()
    assert 'kvmux_mux_lookups_total{child="0:memory",engine="0",model_name="m"} 4.0' in text
    assert 'kvmux_mux_errors_total{child="1:memory",engine="0",model_name="m"} 2.0' in text
    assert 'kvmux_mux_breaker_open{child="1:memory",engine="0",model_name="m"} 1.0' in text
    assert 'kvmux_mux_breaker_open{child="0:memory",engine="0",model_name="m"} 0.0' in text


def test_each_childs_own_metrics_carry_its_label_even_for_two_of_one_class() -> None:
    scripted.reset()
    ktc = KVTransferConfig(
        kv_connector="MuxConnector",
        kv_connector_module_path="kvmux.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [child("a"), child("b")]},
    )
    config = SimpleNamespace(kv_transfer_config=ktc)
    registry = CollectorRegistry()
    prom = MuxConnector.build_prom_metrics(config, metric_types(registry), LABELS, {0: ["m", "0"]})
    payload = {
        "0:ScriptedConnector": {"connector": None, "stats": {"hits": 2}},
        "1:ScriptedConnector": {"connector": None, "stats": {"hits": 5}},
    }
    prom.observe(payload, 0)
    text = generate_latest(registry).decode()
    assert 'scripted_hits_total{child="0:ScriptedConnector",engine="0",model_name="m"} 2.0' in text
    assert 'scripted_hits_total{child="1:ScriptedConnector",engine="0",model_name="m"} 5.0' in text


def test_a_tiers_counters_exist_from_the_start_and_count() -> None:
    registry = CollectorRegistry()
    prom = TierPromMetrics(
        SimpleNamespace(kv_transfer_config=None),
        metric_types(registry),
        LABELS,
        {0: ["m", "0"]},
        "disk",
    )
    text = generate_latest(registry).decode()
    for name in TIER_COUNTERS:
        assert f'kvmux_tier_{name}_total{{engine="0",model_name="m",tier="disk"}} 0.0' in text
    prom.observe({"hit_tokens": 256, "load_errors": 1, "stored_bytes": 9}, 0)
    text = generate_latest(registry).decode()
    assert 'kvmux_tier_hit_tokens_total{engine="0",model_name="m",tier="disk"} 256.0' in text
    assert 'kvmux_tier_load_errors_total{engine="0",model_name="m",tier="disk"} 1.0' in text
    assert "stored_bytes" not in text  # a level, not a counter
