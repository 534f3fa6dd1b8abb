"""An in-process dict of bytes, LRU within a byte budget: a store for tools and tests.

This is not the memory tier: a ``"type": "memory"`` tier keeps blocks in host slots
(``kvmux.tier.worker.slab``) and never stores bytes here. ``open_store`` still builds a
``DictStore`` from a ``MemorySpec``, for tools that want a byte store of that size.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from kvmux.stores.base import KVStore, StoredEntry

__all__ = ["DictStore"]


class DictStore(KVStore):
    """Bytes in a dict of this process, LRU, never more than ``capacity`` bytes."""

    def __init__(self, capacity: int, name: str = "dict"):
        self.name = name
        self.capacity = capacity
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()

    def put(self, key: bytes, value: bytes) -> bool:
        """Insert ``value``, evicting least recently used entries to fit."""
        size = len(value)
        if size > self.capacity:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= len(old)
            while self._used + size > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self._used -= len(evicted)
            self._entries[key] = value
            self._used += size
        return True

    def get(self, key: bytes) -> bytes | None:
        """The value, marked most recently used."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def contains(self, key: bytes) -> bool:
        """Whether ``key`` is held."""
        with self._lock:
            return key in self._entries

    def delete(self, key: bytes) -> None:
        """Drop ``key`` if held."""
        with self._lock:
            value = self._entries.pop(key, None)
            if value is not None:
                self._used -= len(value)

    def head_many(self, keys: Sequence[bytes], size: int) -> list[bytes | None]:
        """The values' first bytes, leaving the LRU order as it is."""
        with self._lock:
            values = [self._entries.get(key) for key in keys]
        return [None if value is None else value[:size] for value in values]

    def walk(self, min_age: float | None = None) -> list[StoredEntry]:
        """Every entry, least recently used first (ages are not tracked: all are kept)."""
        with self._lock:
            return [StoredEntry(key, len(value), None) for key, value in self._entries.items()]

    def used_bytes(self) -> int:
        """Bytes held."""
        with self._lock:
            return self._used

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._entries.clear()
            self._used = 0
