"""Typed, frozen configuration of both connectors, parsed once from their extra config.

StoreConnector takes one store spec (``parse_store_connector_config``); MuxConnector takes
children, a load policy and breaker settings (``parse_mux_config``). Every error is a
ConfigError that names the key and the accepted values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from kvmux.codec import SigningKeys
from kvmux.errors import ConfigError
from kvmux.policies.registry import policy_names

__all__ = [
    "ASYNC_LOADS",
    "INHERITED",
    "POLICIES",
    "ChildConfig",
    "DiskSpec",
    "MemorySpec",
    "MuxConfig",
    "RedisSpec",
    "StoreConnectorConfig",
    "StoreSpec",
    "parse_capacity",
    "parse_mux_config",
    "parse_store_connector_config",
    "parse_store_spec",
    "store_child",
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
_SAVE_QUEUE_HELP = f'"auto" or {_CAPACITY_HELP}'


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
    save_queue: int | None = None  # host bytes of saves in flight (None: sized to the engine)
    async_loads: str = "auto"  # auto | always | never: loads off the forward path (see ASYNC_LOADS)
    offload_prompt_only: bool = True  # save prompt blocks only; False: generated blocks too
    epoch: str = ""  # the operator's label of what was stored: a new one serves nothing older
    signing: SigningKeys | None = field(default=None, repr=False)  # sign and verify entries


@dataclass(frozen=True)
class DiskSpec:
    """One directory of entry files, shareable by several engines, within a byte budget."""

    path: Path  # directory holding the entries (created 0700 if missing)
    capacity: int  # byte budget; oldest entries are evicted past it
    name: str = "disk"  # label used in logs and stats
    direct_writes: bool = False  # True: write entries around the page cache (O_DIRECT)
    save_queue: int | None = None  # host bytes of saves in flight (None: sized to the engine)
    async_loads: str = "auto"  # auto | always | never: loads off the forward path (see ASYNC_LOADS)
    offload_prompt_only: bool = True  # save prompt blocks only; False: generated blocks too
    epoch: str = ""  # the operator's label of what was stored: a new one serves nothing older
    signing: SigningKeys | None = field(default=None, repr=False)  # sign and verify entries


@dataclass(frozen=True)
class RedisSpec:
    """A Redis or Valkey deployment (standalone or cluster) shared by many engines."""

    url: str  # redis://, rediss:// (TLS) or unix:// URL; user and password may be in it
    name: str = "redis"  # label used in logs and stats
    cluster: bool = False  # Redis Cluster: slot routing, MOVED/ASK handled by the client
    key_prefix: str = "kvmux:"  # every key starts with this
    ttl_seconds: int | None = None  # expire entries after this long (None: never)
    socket_timeout: float = 0.5  # seconds a socket read/write may take
    connect_timeout: float = 0.5  # seconds to connect
    max_value_size: int = 64 * 2**20  # larger entries are split into parts
    username: str | None = None  # ACL user (overrides the URL's)
    password_env: str | None = None  # name of an environment variable holding the password
    ca_cert: str | None = None  # TLS: CA bundle path
    cert: str | None = None  # TLS: client certificate path
    key: str | None = None  # TLS: client key path
    lookup_wait: float = 0.005  # seconds the scheduler waits for a lookup before asking again
    breaker_seconds: float = 1.0  # first back-off after the server failed
    save_queue: int | None = None  # host bytes of saves in flight (None: sized to the engine)
    async_loads: str = "auto"  # auto | always | never: loads off the forward path (see ASYNC_LOADS)
    offload_prompt_only: bool = True  # save prompt blocks only; False: generated blocks too
    epoch: str = ""  # the operator's label of what was stored: a new one serves nothing older
    signing: SigningKeys | None = field(default=None, repr=False)  # sign and verify entries


StoreSpec = MemorySpec | DiskSpec | RedisSpec
# auto: a disk or Redis tier loads asynchronously, a memory tier synchronously (unless the
# model has several KV cache groups: then every tier does); always; never (one group only)
ASYNC_LOADS = ("auto", "always", "never")
_SIGNING_KEYS = frozenset({"key_env", "key_file"})

_COMMON_KEYS = frozenset(
    {"type", "name", "save_queue", "signing", "async_loads", "offload_prompt_only", "epoch"}
)
_STORE_KEYS: dict[str, frozenset[str]] = {
    "memory": _COMMON_KEYS | {"capacity"},
    "disk": _COMMON_KEYS | {"path", "capacity", "direct_writes"},
    "redis": frozenset(
        {
            "type",
            "url",
            "name",
            "cluster",
            "key_prefix",
            "ttl_seconds",
            "socket_timeout",
            "connect_timeout",
            "max_value_size",
            "username",
            "password_env",
            "ca_cert",
            "cert",
            "key",
            "lookup_wait",
            "breaker_seconds",
        }
    )
    | _COMMON_KEYS,
}


def _path(where: str, key: str) -> str:
    """The dotted name of ``key`` inside ``where`` (top level when ``where`` is empty)."""
    return f"{where}.{key}" if where else key


def _require_mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(spec: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for name in spec:
        if name not in allowed:
            raise ConfigError(_path(where, name), "unknown key", allowed)


def _required(spec: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in spec:
        raise ConfigError(_path(where, name), "missing required key")
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
    if kind == "redis":
        return _parse_redis(spec, where)
    capacity = parse_capacity(_required(spec, "capacity", where), f"{where}.capacity")
    options = _tier_options(spec, where)
    if kind == "memory":
        return MemorySpec(capacity=capacity, name=_name(spec, "memory", where), **options)
    path = _required(spec, "path", where)
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}.path", f"expected a directory path, got {path!r}")
    return DiskSpec(
        path=Path(path).expanduser(),
        capacity=capacity,
        name=_name(spec, "disk", where),
        direct_writes=_boolean(spec, "direct_writes", False, where),
        **options,
    )


def _tier_options(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The options every store spec takes, parsed (signing last: it reads its keys)."""
    return {
        "save_queue": _save_queue(spec, where),
        "async_loads": _async_loads(spec, where),
        "offload_prompt_only": _prompt_only(spec, where),
        "epoch": _epoch(spec, where),
        "signing": _signing(spec, where),
    }


_EPOCH_MAX = 128


def _epoch(spec: Mapping[str, Any], where: str) -> str:
    """``epoch``: any text up to 128 characters, folded into every key (default: none)."""
    value = spec.get("epoch", "")
    if not isinstance(value, str) or len(value) > _EPOCH_MAX:
        raise ConfigError(_path(where, "epoch"), f"bad value {value!r}", "text of 0-128 characters")
    return value


def _prompt_only(spec: Mapping[str, Any], where: str) -> bool:
    """``offload_prompt_only`` (as vLLM's OffloadingConnector): False saves generated blocks."""
    return _boolean(spec, "offload_prompt_only", True, where)


def _async_loads(spec: Mapping[str, Any], where: str) -> str:
    value = spec.get("async_loads", "auto")
    if value not in ASYNC_LOADS:
        raise ConfigError(_path(where, "async_loads"), f"bad value {value!r}", ASYNC_LOADS)
    return str(value)


def _signing(spec: Mapping[str, Any], where: str) -> SigningKeys | None:
    """Signing keys from ``{"key_env": NAME}`` or ``{"key_file": PATH}``, read now."""
    raw = spec.get("signing")
    if raw is None:
        return None
    path = _path(where, "signing")
    options = _require_mapping(raw, path)
    _check_keys(options, _SIGNING_KEYS, path)
    if len(options) != 1:
        raise ConfigError(path, "give exactly one source of keys", _SIGNING_KEYS)
    source, value = next(iter(options.items()))
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}.{source}", f"expected a non-empty string, got {value!r}")
    text = _signing_text(source, value, f"{path}.{source}")
    try:
        return SigningKeys.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{path}.{source}", str(exc), "lines of id:hexsecret") from exc


def _signing_text(source: str, value: str, path: str) -> str:
    if source == "key_env":
        if value not in os.environ:
            raise ConfigError(path, f"environment variable {value} is not set")
        return os.environ[value]
    try:
        return Path(value).expanduser().read_text()
    except (OSError, UnicodeError) as exc:
        raise ConfigError(path, f"cannot read {value}: {exc}") from exc


def _save_queue(spec: Mapping[str, Any], where: str) -> int | None:
    """A byte bound set by the operator, or None ("auto", the default): sized to the engine."""
    value = spec.get("save_queue", "auto")
    if value == "auto":
        return None
    try:
        return parse_capacity(value, f"{where}.save_queue")
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.problem, _SAVE_QUEUE_HELP) from None


def _positive_number(spec: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(_path(where, key), f"expected a positive number, got {value!r}")
    return float(value)


def _boolean(spec: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(_path(where, key), f"expected a boolean, got {value!r}", "true, false")
    return value


def _optional_str(spec: Mapping[str, Any], key: str, where: str) -> str | None:
    value = spec.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{where}.{key}", f"expected a non-empty string, got {value!r}")
    return value


def _parse_redis(spec: Mapping[str, Any], where: str) -> RedisSpec:
    url = _required(spec, "url", where)
    schemes = ("redis://", "rediss://", "unix://")
    if not isinstance(url, str) or not url.startswith(schemes):
        raise ConfigError(f"{where}.url", f"bad URL {url!r}", schemes)
    cluster = _boolean(spec, "cluster", False, where)
    prefix = spec.get("key_prefix", "kvmux:")
    if not isinstance(prefix, str) or any(c in prefix for c in "{}"):
        raise ConfigError(f"{where}.key_prefix", f"bad prefix {prefix!r}", "a string without { }")
    ttl = spec.get("ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
        raise ConfigError(f"{where}.ttl_seconds", f"expected a positive integer, got {ttl!r}")
    return RedisSpec(
        url=url,
        name=_name(spec, "redis", where),
        cluster=cluster,
        key_prefix=prefix,
        ttl_seconds=ttl,
        socket_timeout=_positive_number(spec, "socket_timeout", 0.5, where),
        connect_timeout=_positive_number(spec, "connect_timeout", 0.5, where),
        max_value_size=parse_capacity(
            spec.get("max_value_size", "64MiB"), f"{where}.max_value_size"
        ),
        username=_optional_str(spec, "username", where),
        password_env=_optional_str(spec, "password_env", where),
        ca_cert=_optional_str(spec, "ca_cert", where),
        cert=_optional_str(spec, "cert", where),
        key=_optional_str(spec, "key", where),
        lookup_wait=_positive_number(spec, "lookup_wait", 0.005, where),
        breaker_seconds=_positive_number(spec, "breaker_seconds", 1.0, where),
        **_tier_options(spec, where),
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
    fail = _boolean(extra, "fail_on_load_error", False, "")
    return StoreConnectorConfig(store=store, fail_on_load_error=fail)


# -- MuxConnector ----------------------------------------------------------------

POLICIES = policy_names()  # the built-in ones; policies/registry.py registers more
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


def parse_mux_config(raw: Any, inherited: Mapping[str, Any]) -> MuxConfig:
    """Parse MuxConnector's extra config; ``inherited`` are the top-level fields children get."""
    extra = _require_mapping(raw, "kv_connector_extra_config")
    _check_keys(extra, _MUX_KEYS, "")
    policy = extra.get("policy", "first")
    if policy not in policy_names():
        raise ConfigError("policy", f"unknown policy {policy!r}", policy_names())
    return MuxConfig(
        children=_children(extra, inherited),
        policy=policy,
        breaker_seconds=_positive_number(extra, "breaker_seconds", 5.0, ""),
        breaker_max_seconds=_positive_number(extra, "breaker_max_seconds", 60.0, ""),
        fail_on_load_error=_boolean(extra, "fail_on_load_error", False, ""),
    )
