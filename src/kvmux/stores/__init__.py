"""Byte stores behind kvmux's tiers."""

from kvmux.stores.base import KVStore
from kvmux.stores.disk import DiskStore
from kvmux.stores.factory import open_store
from kvmux.stores.memory import MemoryStore

__all__ = ["DiskStore", "KVStore", "MemoryStore", "open_store"]
