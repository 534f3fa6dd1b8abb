"""Host-memory store: an LRU of bytes within a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict

from kvmux.stores.base import KVStore

__all__ = ["MemoryStore"]


class MemoryStore(KVStore):
    """LRU byte store that never holds more than ``capacity`` bytes."""

    def __init__(self, capacity: int, name: str = "memory"):
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
