"""MuxConnector's children: their configs, their classes through vLLM's factory, and what
MuxConnector's class answers for them together."""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

from kvmux.config import INHERITED, MuxConfig, parse_mux_config
from kvmux.errors import ConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = [
    "all_support_lookahead",
    "all_support_sleep_mode",
    "any_piecewise_for_cudagraph",
    "child_classes",
    "child_transfer_configs",
    "children_prom_metrics",
    "common_kvcache_layout",
    "every_cache_access",
    "mux_config",
    "refuse_hybrid_without_hma",
]

log = logging.getLogger("kvmux.mux")


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


# -- what MuxConnector's class says for its children's classes ------------------------


def common_kvcache_layout(vllm_config: VllmConfig) -> str | None:
    """The children's common KV cache layout requirement; a mismatch is a ConfigError."""
    wanted: dict[str, str] = {}
    for label, child_cls, temp in child_classes(vllm_config):
        layout = child_cls.get_required_kvcache_layout(temp)
        if layout is not None:
            wanted[label] = layout
    if len(set(wanted.values())) > 1:
        found = ", ".join(f"{label} needs {layout}" for label, layout in wanted.items())
        raise ConfigError("connectors", f"KV cache layout mismatch: {found}")
    return next(iter(wanted.values()), None)


def any_piecewise_for_cudagraph(extra_config: dict[str, Any]) -> bool:
    """True if any child of this extra config needs piecewise CUDA graphs."""
    ktc = KVTransferConfig(
        kv_connector="MuxConnector", kv_role="kv_both", kv_connector_extra_config=extra_config
    )
    return any(
        child_cls.requires_piecewise_for_cudagraph(child_ktc.kv_connector_extra_config)
        for _, child_cls, child_ktc in child_transfer_configs(ktc)
    )


def all_support_sleep_mode(ktc: KVTransferConfig) -> bool:
    """(vLLM 0.33+) Only when every child does."""
    children = child_transfer_configs(ktc)
    return all(getattr(c, "supports_sleep_mode", lambda _: True)(k) for _, c, k in children)


def all_support_lookahead(ktc: KVTransferConfig) -> bool:
    """(vLLM 0.34+) Only when there are children and every one does."""
    children = child_transfer_configs(ktc)
    return bool(children) and all(
        getattr(c, "supports_lookahead_block_hashes", lambda _: False)(k) for _, c, k in children
    )


def every_cache_access(ktc: KVTransferConfig) -> Any:
    """(vLLM 0.34+) Every access any child needs to the KV cache memory."""
    from vllm.config.kv_transfer import KVCacheAccess  # type: ignore[attr-defined]

    access = KVCacheAccess.IN_PROCESS
    ask = getattr(KVConnectorFactory, "kv_cache_access", None)
    for _, child_cls, child_ktc in child_transfer_configs(ktc):
        access |= ask(child_ktc) if ask else child_cls.kv_cache_access(child_ktc)
    return access


def children_prom_metrics(
    vllm_config: VllmConfig, types: Any, labelnames: list[str], per_engine_labelvalues: Any
) -> dict[str, Any]:
    """Each child's own Prometheus metrics, with its label last (None where it has none)."""
    children: dict[str, Any] = {}
    for label, child_cls, temp in child_classes(vllm_config):
        values = {i: [*v, label] for i, v in per_engine_labelvalues.items()}
        try:
            children[label] = child_cls.build_prom_metrics(temp, types, labelnames, values)
        except Exception as exc:  # a child's metrics never keep the engine from starting
            log.warning("kvmux mux: child %s has no Prometheus metrics: %r", label, exc)
            children[label] = None
    return children


def refuse_hybrid_without_hma(
    children: list[tuple[str, type[Any], Any]], kv_cache_groups: int
) -> None:
    """A model with several KV cache groups needs every child to handle them (SupportsHMA)."""
    if kv_cache_groups <= 1:
        return
    unable = [label for label, cls, _ in children if not supports_hma(cls)]
    if unable:
        raise ConfigError(
            "connectors",
            f"this model has {kv_cache_groups} KV cache groups (hybrid attention), which "
            f"{', '.join(unable)} cannot handle: start vLLM with "
            "--disable-hybrid-kv-cache-manager, or use only children that support HMA",
        )
