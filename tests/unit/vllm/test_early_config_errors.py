"""A bad extra config stops vLLM at the first class-level query it makes, before the model
runs: each one raises the same ConfigError as the constructor and ``kvmux check-config``."""

from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.config import KVTransferConfig

from kvmux.errors import ConfigError
from kvmux.tools.check import check_config
from kvmux.vllm import MuxConnector, StoreConnector

BAD_STORE = {"store": {"type": "disk", "path": "/nonexistent/kvmux", "capacity": "lots"}}
GOOD_STORE = {"store": {"type": "memory", "capacity": "1MiB"}}


def store_fields(extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "StoreConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def mux_fields(extra: dict[str, Any]) -> dict[str, Any]:
    return {**store_fields(extra), "kv_connector": "MuxConnector"}


def config_of(fields: dict[str, Any]) -> Any:
    return SimpleNamespace(kv_transfer_config=KVTransferConfig(**fields))


def offline_error(fields: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        check_config(json.dumps(fields))
    return str(caught.value)


def build_metrics(cls: Any, config: Any) -> Any:
    types = {k: partial(k, registry=CollectorRegistry()) for k in (Counter, Gauge, Histogram)}
    return cls.build_prom_metrics(config, types, ["model_name"], {0: ["m"]})


BAD_CONFIGS = {
    "store": store_fields(BAD_STORE),
    "store, unknown key": store_fields({**GOOD_STORE, "stor": {}}),
    "mux, bad tier": mux_fields({"tiers": [BAD_STORE["store"]]}),
    "mux, bad policy": mux_fields({"tiers": [GOOD_STORE["store"]], "policy": "fastest"}),
    "mux, bad store child": mux_fields({"connectors": [store_fields(BAD_STORE)]}),
}
CLASSES = {"StoreConnector": StoreConnector, "MuxConnector": MuxConnector}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_get_required_kvcache_layout_raises_the_offline_checks_error(case: str) -> None:
    fields = BAD_CONFIGS[case]
    cls = CLASSES[fields["kv_connector"]]
    with pytest.raises(ConfigError) as caught:
        cls.get_required_kvcache_layout(config_of(fields))
    assert str(caught.value) == offline_error(fields)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_requires_piecewise_for_cudagraph_raises_the_offline_checks_error(case: str) -> None:
    fields = BAD_CONFIGS[case]
    cls = CLASSES[fields["kv_connector"]]
    with pytest.raises(ConfigError) as caught:
        cls.requires_piecewise_for_cudagraph(fields["kv_connector_extra_config"])
    assert str(caught.value) == offline_error(fields)


@pytest.mark.parametrize("case", [c for c in BAD_CONFIGS if c.startswith("store")])
def test_a_store_connectors_build_prom_metrics_raises_the_offline_checks_error(
    case: str,
) -> None:
    fields = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as caught:
        build_metrics(StoreConnector, config_of(fields))
    assert str(caught.value) == offline_error(fields)


def test_a_mux_config_error_is_raised_by_build_prom_metrics_too() -> None:
    fields = BAD_CONFIGS["mux, bad policy"]
    with pytest.raises(ConfigError, match="policy"):
        build_metrics(MuxConnector, config_of(fields))


def test_a_good_config_passes_every_class_level_query() -> None:
    store, mux = store_fields(GOOD_STORE), mux_fields({"connectors": [store_fields(GOOD_STORE)]})
    for fields, cls in ((store, StoreConnector), (mux, MuxConnector)):
        assert cls.get_required_kvcache_layout(config_of(fields)) is None
        assert cls.requires_piecewise_for_cudagraph(fields["kv_connector_extra_config"]) is False
        assert build_metrics(cls, config_of(fields)) is not None
