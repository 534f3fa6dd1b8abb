"""vLLM's general plugin: MuxConnector and StoreConnector by name, without a module path.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes before it
builds connectors, so with kvmux installed ``"kv_connector": "MuxConnector"`` is enough;
``"kv_connector_module_path": "kvmux.vllm"`` still works (it takes priority).
"""

from __future__ import annotations

import logging

__all__ = ["CONNECTORS", "register"]

CONNECTORS = {
    "MuxConnector": "kvmux.vllm.mux_connector",
    "StoreConnector": "kvmux.vllm.store_connector",
}

log = logging.getLogger(__name__)


def register() -> None:
    """Register kvmux's connectors with vLLM's connector factory (once per process)."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError as exc:  # a vLLM without V1 connectors: the module path still works
        log.debug("kvmux: vLLM's connector factory is not importable: %r", exc)
        return
    for name, module in CONNECTORS.items():
        if name not in KVConnectorFactory._registry:
            KVConnectorFactory.register_connector(name, module, name)
