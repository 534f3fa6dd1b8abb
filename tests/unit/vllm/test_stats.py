"""MuxConnector's Prometheus metrics: its counters per child, and each child's own."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from vllm.config import KVTransferConfig

from kvmux.vllm import MuxConnector, StoreConnector
from kvmux.vllm.prom import TIER_COUNTERS, MuxPromMetrics, TierPromMetrics
from kvmux.vllm.stats import MuxConnectorStats, StoreConnectorStats, connector_path
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


def store_ktc(name: str, **extra: Any) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="StoreConnector",
        kv_connector_module_path="kvmux.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"store": {"type": "memory", "capacity": "1MiB", "name": name}}
        | extra,
    )


def test_a_store_connector_alone_exports_its_tiers_counters_without_a_child_label() -> None:
    registry = CollectorRegistry()
    config = SimpleNamespace(kv_transfer_config=store_ktc("fast"))
    prom = StoreConnector.build_prom_metrics(
        config, metric_types(registry), LABELS, {0: ["m", "0"]}
    )
    assert isinstance(prom, TierPromMetrics)
    text = generate_latest(registry).decode()
    for name in TIER_COUNTERS:
        assert f'kvmux_tier_{name}_total{{engine="0",model_name="m",tier="fast"}} 0.0' in text
    assert "child=" not in text
    stats = StoreConnector.build_kv_connector_stats({"hit_tokens": 128})
    stats.aggregate(StoreConnector.build_kv_connector_stats({"hit_tokens": 128}))
    prom.observe(stats.to_dict(), 0)
    text = generate_latest(registry).decode()
    assert 'kvmux_tier_hit_tokens_total{engine="0",model_name="m",tier="fast"} 256.0' in text


def test_store_connectors_under_a_mux_export_their_tiers_once_with_their_child_label() -> None:
    tiers = [
        {"type": "memory", "capacity": "1MiB", "name": "memory"},
        {"type": "disk", "path": "/nonexistent/kvmux", "capacity": "1MiB", "name": "disk"},
    ]
    ktc = KVTransferConfig(
        kv_connector="MuxConnector",
        kv_connector_module_path="kvmux.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"tiers": tiers},
    )
    registry = CollectorRegistry()
    prom = MuxConnector.build_prom_metrics(
        SimpleNamespace(kv_transfer_config=ktc), metric_types(registry), LABELS, {0: ["m", "0"]}
    )
    text = generate_latest(registry).decode()
    for child, tier in (("0:memory", "memory"), ("1:disk", "disk")):
        labels = f'child="{child}",engine="0",model_name="m",tier="{tier}"'
        series = f"kvmux_tier_hit_tokens_total{{{labels}}}"
        assert text.count(series) == 1 and f"{series} 0.0" in text
    stats = MuxConnectorStats(connectors={"1:disk": connector_path(StoreConnector)})
    stats.data["1:disk"] = StoreConnectorStats(data={"hit_tokens": 384, "load_errors": 1})
    prom.observe(stats.to_dict(), 0)
    text = generate_latest(registry).decode()
    labels = 'child="1:disk",engine="0",model_name="m",tier="disk"'
    assert f"kvmux_tier_hit_tokens_total{{{labels}}} 384.0" in text
    assert f"kvmux_tier_load_errors_total{{{labels}}} 1.0" in text
    assert text.count("kvmux_tier_hit_tokens_total{") == 2  # one series per tier, no extra
