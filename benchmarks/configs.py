"""The connector configurations a benchmark run compares, all built for one work directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.profiles import DISK_CAPACITY

__all__ = ["CONFIGS", "DISK_CONFIGS", "LMCACHE_PORT", "disk_tier", "kv_config"]

LMCACHE_PORT = 5555
CONFIGS = (
    "none",
    "vllm-prefix-cache",
    "example",
    "multi-example",
    "lmcache",
    "kvmux-memory",
    "kvmux-mux-first",
    "kvmux-mux-compose",
    "kvmux-mux-redis",
)
DISK_CONFIGS = ("kvmux-mux-first", "kvmux-mux-compose", "kvmux-mux-redis")  # with a disk tier
MEMORY = {"type": "memory", "capacity": "2GiB", "name": "memory"}


def _example(path: Path) -> dict[str, Any]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }


def _mux(policy: str, tiers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": policy, "tiers": tiers},
    }


def disk_tier(path: Path, direct_writes: bool, capacity: str = DISK_CAPACITY) -> dict[str, Any]:
    """The benchmark's disk tier at ``path``, written around the page cache or not."""
    tier: dict[str, Any] = {"type": "disk", "path": str(path), "capacity": capacity, "name": "disk"}
    if direct_writes:
        tier["direct_writes"] = True
    return tier


def kv_config(
    name: str,
    work: Path,
    redis_url: str | None,
    direct_writes: bool = False,
    disk_path: Path | None = None,
    disk_capacity: str = DISK_CAPACITY,
) -> dict[str, Any] | None:
    """KVTransferConfig fields of configuration ``name`` (None: no connector);
    ``direct_writes``: its disk tier's (``host_memory.disk_writes``), at ``disk_path``
    (default ``work/disk``), of ``disk_capacity``."""
    disk = disk_tier(disk_path or work / "disk", direct_writes, disk_capacity)
    if name in ("none", "vllm-prefix-cache"):
        return None
    if name == "example":
        return _example(work / "example")
    if name == "multi-example":
        children = [_example(work / "example-a"), _example(work / "example-b")]
        return {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": children},
        }
    if name == "lmcache":
        extra = {"lmcache.mp.host": "tcp://localhost", "lmcache.mp.port": LMCACHE_PORT}
        return {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
    if name == "kvmux-memory":
        return {
            "kv_connector": "StoreConnector",
            "kv_connector_module_path": "kvmux.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"store": MEMORY},
        }
    if name == "kvmux-mux-first":
        return _mux("first", [MEMORY, disk])
    if name == "kvmux-mux-compose":
        return _mux("compose", [MEMORY, disk])
    if name == "kvmux-mux-redis":
        if redis_url is None:
            raise RuntimeError("no redis-server available")
        redis = {
            "type": "redis",
            "url": redis_url,
            "name": "redis",
            "key_prefix": f"bench-{work.name}:",
        }
        return _mux("compose", [MEMORY, disk, redis])
    raise ValueError(f"unknown configuration {name!r}")
