"""The tier a command works on, named as a config names it, opened for reading.

``--store JSON`` takes one store spec exactly as ``kv_connector_extra_config["store"]``
does, parsed by ``kvmux.config`` (so errors are ConfigErrors naming the key);
``--disk PATH`` and ``--redis URL`` are shortcuts for the usual specs. Signing keys come
from the spec's ``signing`` or from ``--signing-key-file`` / ``--signing-key-env``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kvmux.config import DiskSpec, MemorySpec, RedisSpec, StoreSpec, parse_store_spec
from kvmux.errors import ConfigError, StoreUnavailable
from kvmux.stores import KVStore, open_store

__all__ = ["SHORTCUT_READ_LIMIT", "describe_tier", "open_tier", "tier_spec"]

SHORTCUT_READ_LIMIT = "1GiB"  # --disk: larger files are never read (a spec's capacity bounds it)
_SOURCES = ("--store", "--disk", "--redis")


def tier_spec(
    store: str | None = None,
    disk: str | None = None,
    redis: str | None = None,
    cluster: bool = False,
    key_file: str | None = None,
    key_env: str | None = None,
) -> StoreSpec:
    """The spec of the tier named by exactly one of ``store``, ``disk`` and ``redis``."""
    given = [name for name, value in zip(_SOURCES, (store, disk, redis), strict=True) if value]
    if len(given) != 1:
        raise ConfigError("store", "name the tier with exactly one option", _SOURCES)
    if cluster and not redis:
        raise ConfigError("--cluster", 'goes with --redis (in a spec: "cluster": true)')
    raw = dict(_raw_spec(store, disk, redis, cluster))
    signing = {"key_file": key_file} if key_file else {"key_env": key_env} if key_env else None
    if signing is not None:
        if "signing" in raw:
            raise ConfigError("store.signing", "given in the spec and on the command line")
        raw["signing"] = signing
    spec = parse_store_spec(raw, "store")
    if isinstance(spec, MemorySpec):
        raise ConfigError("store.type", "a memory tier lives in its engine", ("disk", "redis"))
    return spec


def _raw_spec(
    store: str | None, disk: str | None, redis: str | None, cluster: bool
) -> Mapping[str, Any]:
    if disk:
        return {"type": "disk", "path": disk, "capacity": SHORTCUT_READ_LIMIT}
    if redis:
        return {"type": "redis", "url": redis, "cluster": cluster}
    try:
        raw = json.loads(store or "")
    except ValueError as exc:
        raise ConfigError("store", f"not JSON: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError("store", f"expected a mapping, got {type(raw).__name__}")
    return raw


def open_tier(spec: StoreSpec) -> KVStore:
    """Open the tier for operators: reads leave recency alone; a disk path must exist."""
    if isinstance(spec, DiskSpec) and not Path(spec.path).is_dir():
        raise StoreUnavailable(f"disk tier {spec.path}: no such directory")
    return open_store(spec, touch=False)


def describe_tier(spec: StoreSpec) -> dict[str, str]:
    """Type, name and location of a tier, without secrets (a URL's password is dropped)."""
    if isinstance(spec, DiskSpec):
        return {"type": "disk", "name": spec.name, "location": str(spec.path)}
    if isinstance(spec, RedisSpec):
        url = urlsplit(spec.url)
        host = url.netloc.rpartition("@")[2]
        user = f"{url.username}@" if url.username else ""
        where = urlunsplit((url.scheme, user + host, url.path, "", ""))
        return {"type": "redis", "name": spec.name, "location": f"{where} {spec.key_prefix}"}
    return {"type": "memory", "name": spec.name, "location": "-"}
