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

__all__ = ["child_classes", "child_transfer_configs", "mux_config"]


def _parse(ktc: KVTransferConfig) -> MuxConfig:
    inherited = {name: getattr(ktc, name) for name in INHERITED}
    return parse_mux_config(ktc.kv_connector_extra_config, inherited)


def mux_config(vllm_config: VllmConfig) -> MuxConfig:
    """MuxConnector's parsed extra config; children inherit the top-level fields."""
    ktc = vllm_config.kv_transfer_config
    assert ktc is not None
    return _parse(ktc)


def child_transfer_configs(ktc: KVTransferConfig) -> list[tuple[str, type[Any], KVTransferConfig]]:
    """(label, class, KVTransferConfig) for every child of a MuxConnector config."""
    children = []
    for child in _parse(ktc).children:
        try:
            child_ktc = KVTransferConfig(**child.fields)
            cls = KVConnectorFactory.get_connector_class(child_ktc)
        except (ValueError, TypeError, ImportError, AttributeError) as exc:
            raise ConfigError(f"connectors[{child.label}]", f"cannot load child: {exc}") from exc
        children.append((child.label, cls, child_ktc))
    return children


def child_classes(vllm_config: VllmConfig) -> list[tuple[str, type[Any], Any]]:
    """(label, class, child VllmConfig) for every configured child."""
    ktc = vllm_config.kv_transfer_config
    assert ktc is not None
    children = []
    for label, cls, child_ktc in child_transfer_configs(ktc):
        temp = copy.copy(vllm_config)
        temp.kv_transfer_config = child_ktc
        children.append((label, cls, temp))
    return children
