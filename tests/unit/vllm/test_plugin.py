"""kvmux.vllm.plugin: vLLM's general plugin registers kvmux's connectors by name."""

from __future__ import annotations

import tomllib
from pathlib import Path

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvmux.vllm import MuxConnector, StoreConnector
from kvmux.vllm.plugin import register

ROOT = Path(__file__).resolve().parents[3]


def test_the_package_declares_the_plugin_to_vllm() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    plugins = project["entry-points"]["vllm.general_plugins"]
    assert "kvmux.vllm.plugin:register" in plugins.values()


def test_registering_twice_is_harmless_and_names_resolve_to_the_classes() -> None:
    register()
    register()  # vLLM loads plugins in every process, sometimes more than once
    assert KVConnectorFactory.get_connector_class_by_name("MuxConnector") is MuxConnector
    assert KVConnectorFactory.get_connector_class_by_name("StoreConnector") is StoreConnector
