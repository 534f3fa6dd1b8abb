"""MuxConnector's extra config, parsed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvmux.config import parse_store_spec
from kvmux.errors import ConfigError

__all__ = ["POLICIES", "ChildConfig", "MuxConfig", "parse_mux_config", "store_child"]

POLICIES = ("first", "longest", "compose")
INHERITED = ("engine_id", "kv_role", "kv_buffer_device", "kv_load_failure_policy")
_MUX_KEYS = frozenset(
    {
        "connectors",
        "tiers",
        "policy",
        "breaker_seconds",
        "breaker_max_seconds",
        "fail_on_load_error",
    }
)


@dataclass(frozen=True)
class ChildConfig:
    """One child: KVTransferConfig fields exactly as vLLM's MultiConnector takes them."""

    fields: Mapping[str, Any]
    label: str  # "<position>:<name>", unique, used in logs and stats


@dataclass(frozen=True)
class MuxConfig:
    """Children in load order, the load policy and the breaker's back-off."""

    children: tuple[ChildConfig, ...]
    policy: str = "first"  # first | longest | compose
    breaker_seconds: float = 5.0  # first back-off after a child fails
    breaker_max_seconds: float = 60.0  # back-off doubles per failure up to this
    fail_on_load_error: bool = False  # keep vLLM's "fail" policy instead of recompute


def store_child(store: Mapping[str, Any]) -> dict[str, Any]:
    """KVTransferConfig fields of a StoreConnector child over one kvmux store spec."""
    return {
        "kv_connector": "StoreConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_connector_extra_config": {"store": dict(store)},
    }


def _child_name(fields: Mapping[str, Any]) -> str:
    extra = fields.get("kv_connector_extra_config") or {}
    store = extra.get("store") if isinstance(extra, Mapping) else None
    if fields.get("kv_connector") == "StoreConnector" and isinstance(store, Mapping):
        return str(store.get("name") or store.get("type"))
    return str(fields.get("kv_connector"))


def _children(extra: Mapping[str, Any], inherited: Mapping[str, Any]) -> tuple[ChildConfig, ...]:
    raw: list[dict[str, Any]] = []
    tiers = extra.get("tiers", [])
    if not isinstance(tiers, list):
        raise ConfigError("tiers", "expected a list of store specs")
    for i, tier in enumerate(tiers):
        parse_store_spec(tier, f"tiers[{i}]")
        raw.append(store_child(tier))
    connectors = extra.get("connectors", [])
    if not isinstance(connectors, list):
        raise ConfigError("connectors", "expected a list of KVTransferConfig mappings")
    for i, child in enumerate(connectors):
        if not isinstance(child, Mapping) or not child.get("kv_connector"):
            raise ConfigError(f"connectors[{i}].kv_connector", "missing connector name")
        raw.append(dict(child))
    if not raw:
        raise ConfigError(
            "connectors", "MuxConnector needs at least one child", "tiers, connectors"
        )
    children = []
    for position, fields in enumerate(raw):
        merged = {k: v for k, v in inherited.items() if v is not None and k not in fields}
        merged.update(fields)
        children.append(ChildConfig(merged, f"{position}:{_child_name(fields)}"))
    return tuple(children)


def _seconds(extra: Mapping[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _flag(extra: Mapping[str, Any], key: str) -> bool:
    value = extra.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected a boolean, got {value!r}", "true, false")
    return value


def parse_mux_config(raw: Any, inherited: Mapping[str, Any]) -> MuxConfig:
    """Parse MuxConnector's extra config; ``inherited`` are the top-level fields children get."""
    if not isinstance(raw, Mapping):
        raise ConfigError("kv_connector_extra_config", "expected a mapping")
    for key in raw:
        if key not in _MUX_KEYS:
            raise ConfigError(key, "unknown key", _MUX_KEYS)
    policy = raw.get("policy", "first")
    if policy not in POLICIES:
        raise ConfigError("policy", f"unknown policy {policy!r}", POLICIES)
    return MuxConfig(
        children=_children(raw, inherited),
        policy=policy,
        breaker_seconds=_seconds(raw, "breaker_seconds", 5.0),
        breaker_max_seconds=_seconds(raw, "breaker_max_seconds", 60.0),
        fail_on_load_error=_flag(raw, "fail_on_load_error"),
    )
