"""Removing entries in batches, remembering what could not be removed."""

from __future__ import annotations

from typing import Any

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores import KVStore

__all__ = ["DELETE_BATCH", "Remover"]

DELETE_BATCH = 256  # keys per delete_many (one pipeline on Redis)


class Remover:
    """Removes keys in batches; a store that is down stops it, other errors are noted."""

    def __init__(self, store: KVStore):
        self.store = store
        self.pending: list[bytes] = []
        self.removed: set[bytes] = set()
        self.failed: dict[bytes, str] = {}

    def add(self, key: bytes) -> None:
        """Remove ``key`` with the next batch."""
        self.pending.append(key)
        if len(self.pending) >= DELETE_BATCH:
            self.flush()

    def flush(self) -> None:
        """Remove the pending keys (one by one if the batch failed, to find which)."""
        keys, self.pending = self.pending, []
        try:
            self.store.delete_many(keys)
        except StoreUnavailable:
            raise
        except StoreError:
            for key in keys:
                self._remove_one(key)
        else:
            self.removed.update(keys)

    def _remove_one(self, key: bytes) -> None:
        try:
            self.store.delete(key)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            self.failed[key] = str(exc)
        else:
            self.removed.add(key)

    def to_json(self) -> dict[str, Any]:
        """How many were removed, and which could not be, with the error."""
        failed = [{"key": key.hex(), "error": error} for key, error in self.failed.items()]
        return {"removed": len(self.removed), "failed": failed}

    def failures_line(self) -> str:
        """A note on the keys that could not be removed, or nothing."""
        if not self.failed:
            return ""
        key, error = next(iter(self.failed.items()))
        return f"could not remove {len(self.failed):,} entries, e.g. {key.hex()}: {error}\n"
