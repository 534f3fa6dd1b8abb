"""Every benchmark configuration builds a connector config that its connector accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.configs import CONFIGS, kv_config
from kvmux.config import parse_mux_config, parse_store_connector_config

pytest.importorskip("vllm")
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

REDIS_URL = "redis://localhost:6390/0"
KVMUX = {"StoreConnector", "MuxConnector"}


def _parse_kvmux(fields: dict[str, Any]) -> None:
    extra = fields["kv_connector_extra_config"]
    if fields["kv_connector"] == "StoreConnector":
        parse_store_connector_config(extra)
    else:
        parse_mux_config(extra, {"kv_role": fields["kv_role"]})


@pytest.mark.parametrize("name", CONFIGS)
def test_every_configuration_is_a_valid_transfer_config(name: str, tmp_path: Path) -> None:
    fields = kv_config(name, tmp_path, REDIS_URL)
    if fields is None:
        assert name in ("none", "vllm-prefix-cache")
        return
    KVTransferConfig(**fields)  # vLLM's own validation of the fields
    if fields["kv_connector"] in KVMUX:
        assert fields["kv_connector_module_path"] == "kvmux.vllm"
        _parse_kvmux(fields)
        return
    assert fields["kv_connector"] in KVConnectorFactory._registry
    for child in fields["kv_connector_extra_config"].get("connectors", []):
        assert child["kv_connector"] in KVConnectorFactory._registry


def test_tiers_live_in_the_work_directory(tmp_path: Path) -> None:
    for name in CONFIGS:
        text = repr(kv_config(name, tmp_path, REDIS_URL))
        assert "/tmp/" not in text.replace(str(tmp_path), "")


def test_redis_configuration_needs_a_server(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="redis"):
        kv_config("kvmux-mux-redis", tmp_path, None)
    with pytest.raises(ValueError, match="unknown configuration"):
        kv_config("nope", tmp_path, REDIS_URL)


@pytest.mark.parametrize("name", ["kvmux-mux-first", "kvmux-mux-compose", "kvmux-mux-redis"])
def test_the_disk_tier_writes_around_the_page_cache_when_asked(name: str, tmp_path: Path) -> None:
    def disk_of(direct: bool) -> dict[str, Any]:
        fields = kv_config(name, tmp_path, REDIS_URL, direct_writes=direct)
        assert fields is not None
        (disk,) = [t for t in fields["kv_connector_extra_config"]["tiers"] if t["type"] == "disk"]
        return disk

    assert "direct_writes" not in disk_of(False)  # the store's default: the page cache
    assert disk_of(True)["direct_writes"] is True
    fields = kv_config(name, tmp_path, REDIS_URL, direct_writes=True)
    assert fields is not None
    _parse_kvmux(fields)
