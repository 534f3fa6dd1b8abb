"""Build a store from its parsed spec."""

from __future__ import annotations

from kvmux.config import DiskSpec, MemorySpec, RedisSpec, StoreSpec
from kvmux.stores.base import KVStore
from kvmux.stores.dict_store import DictStore
from kvmux.stores.disk import DiskStore

__all__ = ["open_store"]


def open_store(spec: StoreSpec, touch: bool = True) -> KVStore:
    """Open the store a spec describes; raises StoreUnavailable if it cannot.

    ``touch=False`` (operators' tools) asks reads to leave the entries' recency alone.
    """
    if isinstance(spec, MemorySpec):
        return DictStore(spec.capacity, name=spec.name)
    if isinstance(spec, DiskSpec):
        return DiskStore(
            spec.path,
            spec.capacity,
            name=spec.name,
            touch=touch,
            direct_writes=spec.direct_writes,
        )
    if isinstance(spec, RedisSpec):
        from kvmux.stores.redis import RedisStore

        return RedisStore(spec, touch=touch)
    raise TypeError(f"unknown store spec {spec!r}")
