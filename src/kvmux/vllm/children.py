"""MuxConnector's children: their configs, and their classes through vLLM's factory."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvmux.config import INHERITED, MuxConfig, parse_mux_config
from kvmux.errors import ConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["child_classes", "mux_config"]


def mux_config(vllm_config: VllmConfig) -> MuxConfig:
    """MuxConnector's parsed extra config; children inherit the top-level fields."""
    ktc = vllm_config.kv_transfer_config
    assert ktc is not None
    inherited = {name: getattr(ktc, name) for name in INHERITED}
    return parse_mux_config(ktc.kv_connector_extra_config, inherited)


def child_classes(vllm_config: VllmConfig) -> list[tuple[str, type[Any], Any]]:
    """(label, class, child VllmConfig) for every configured child."""
    children = []
    for child in mux_config(vllm_config).children:
        temp = copy.copy(vllm_config)
        try:
            temp.kv_transfer_config = KVTransferConfig(**child.fields)
            cls = KVConnectorFactory.get_connector_class(temp.kv_transfer_config)
        except (ValueError, TypeError, ImportError, AttributeError) as exc:
            raise ConfigError(f"connectors[{child.label}]", f"cannot load child: {exc}") from exc
        children.append((child.label, cls, temp))
    return children
