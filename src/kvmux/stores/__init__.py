"""Byte stores behind kvmux's tiers."""

from kvmux.stores.base import KVStore
from kvmux.stores.dict_store import DictStore
from kvmux.stores.disk import DiskStore
from kvmux.stores.factory import open_store

__all__ = ["DictStore", "DiskStore", "KVStore", "open_store"]
