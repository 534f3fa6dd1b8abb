"""Typed, frozen configuration parsed once from the connector's extra config."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from kvmux.errors import ConfigError

__all__ = [
    "DiskSpec",
    "MemorySpec",
    "StoreConnectorConfig",
    "StoreSpec",
    "parse_capacity",
    "parse_store_connector_config",
    "parse_store_spec",
]

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_CAPACITY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_CAPACITY_HELP = (
    "a positive integer of bytes or a number with B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
)


def parse_capacity(value: Any, key: str) -> int:
    """Parse a byte budget such as ``2GiB``, ``500MB`` or ``1048576`` into bytes."""
    if isinstance(value, bool):
        raise ConfigError(key, f"bad capacity {value!r}", _CAPACITY_HELP)
    if isinstance(value, int):
        number, unit = Decimal(value), ""
    elif isinstance(value, str) and (match := _CAPACITY_RE.match(value)):
        number, unit = Decimal(match.group(1)), match.group(2).upper()
    else:
        raise ConfigError(key, f"bad capacity {value!r}", _CAPACITY_HELP)
    if unit not in _UNITS:
        raise ConfigError(key, f"unknown unit {unit!r} in {value!r}", _CAPACITY_HELP)
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ConfigError(key, f"capacity must be positive, got {value!r}", _CAPACITY_HELP)
    return size


@dataclass(frozen=True)
class MemorySpec:
    """Host memory in the worker process, LRU within a byte budget."""

    capacity: int  # byte budget, never exceeded
    name: str = "memory"  # label used in logs and stats


@dataclass(frozen=True)
class DiskSpec:
    """One directory of entry files, shareable by several engines, within a byte budget."""

    path: Path  # directory holding the entries (created 0700 if missing)
    capacity: int  # byte budget; oldest entries are evicted past it
    name: str = "disk"  # label used in logs and stats


StoreSpec = MemorySpec | DiskSpec

_STORE_KEYS: dict[str, frozenset[str]] = {
    "memory": frozenset({"type", "capacity", "name"}),
    "disk": frozenset({"type", "path", "capacity", "name"}),
}


def _require_mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(spec: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for name in spec:
        if name not in allowed:
            raise ConfigError(f"{where}.{name}", "unknown key", allowed)


def _required(spec: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in spec:
        raise ConfigError(f"{where}.{name}", "missing required key")
    return spec[name]


def _name(spec: Mapping[str, Any], default: str, where: str) -> str:
    value = spec.get("name", default)
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
        raise ConfigError(f"{where}.name", f"bad name {value!r}", "letters, digits, _ . -")
    return value


def parse_store_spec(raw: Any, where: str = "store") -> StoreSpec:
    """Parse one store spec such as ``{"type": "memory", "capacity": "2GiB"}``."""
    spec = _require_mapping(raw, where)
    kind = _required(spec, "type", where)
    if not isinstance(kind, str) or kind not in _STORE_KEYS:
        raise ConfigError(f"{where}.type", f"unknown store type {kind!r}", _STORE_KEYS)
    _check_keys(spec, _STORE_KEYS[kind], where)
    capacity = parse_capacity(_required(spec, "capacity", where), f"{where}.capacity")
    if kind == "memory":
        return MemorySpec(capacity=capacity, name=_name(spec, "memory", where))
    path = _required(spec, "path", where)
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}.path", f"expected a directory path, got {path!r}")
    return DiskSpec(
        path=Path(path).expanduser(), capacity=capacity, name=_name(spec, "disk", where)
    )


@dataclass(frozen=True)
class StoreConnectorConfig:
    """Everything StoreConnector reads from ``kv_connector_extra_config``."""

    store: StoreSpec  # the one tier this connector reads and writes
    fail_on_load_error: bool = False  # keep vLLM's "fail" policy instead of recompute


_CONNECTOR_KEYS = frozenset({"store", "fail_on_load_error"})


def parse_store_connector_config(raw: Any) -> StoreConnectorConfig:
    """Parse StoreConnector's extra config; raises ConfigError naming the bad key."""
    extra = _require_mapping(raw if raw is not None else {}, "kv_connector_extra_config")
    _check_keys(extra, _CONNECTOR_KEYS, "kv_connector_extra_config")
    store = parse_store_spec(_required(extra, "store", "kv_connector_extra_config"), "store")
    fail = extra.get("fail_on_load_error", False)
    if not isinstance(fail, bool):
        raise ConfigError("fail_on_load_error", f"expected a boolean, got {fail!r}", "true, false")
    return StoreConnectorConfig(store=store, fail_on_load_error=fail)
