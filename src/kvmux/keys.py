"""Deterministic, chained, namespaced block keys: the one place kvmux hashes.

Scheme (version ``kvmux-keys-v1``, hash BLAKE3, 16-byte digests):

* ``namespace_id = blake3(canonical_json(namespace))[:16]`` where the namespace names
  everything that changes the bytes of a block: model identity, dtypes, KV shape and
  layout, block size, parallel sizes, platform.
* ``root = blake3("kvmux-keys-v1" | namespace_id | salt)`` where the salt carries the
  per-request cache_salt and LoRA identity.
* ``key[i] = blake3(key[i-1] | uint32le(tokens of block i))`` with ``key[-1] = root``.
* ``store_key(key, rank) = blake3(key | uint16le(rank))[:16]``: each tensor-parallel rank
  holds its own shard of every block.

Nothing depends on PYTHONHASHSEED or process state, so keys agree across processes,
restarts and machines.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NewType

from blake3 import blake3

__all__ = [
    "KEY_SCHEME",
    "BlockKey",
    "StoreKey",
    "block_keys",
    "namespace_id",
    "request_salt",
    "store_key",
]

KEY_SCHEME = "kvmux-keys-v1"
DIGEST_SIZE = 16

BlockKey = NewType("BlockKey", bytes)
StoreKey = NewType("StoreKey", bytes)


def namespace_id(namespace: Mapping[str, Any]) -> bytes:
    """Digest of a namespace mapping, independent of key order."""
    canonical = json.dumps(namespace, sort_keys=True, separators=(",", ":"), default=str)
    return blake3(canonical.encode()).digest(DIGEST_SIZE)


def request_salt(cache_salt: str | None, lora_name: str | None) -> bytes:
    """Per-request salt bytes; empty when the request has neither."""
    if cache_salt is None and lora_name is None:
        return b""
    return json.dumps([cache_salt, lora_name]).encode()


def block_keys(
    namespace: bytes, salt: bytes, token_ids: Sequence[int], block_size: int
) -> list[BlockKey]:
    """Chained keys of every full block of ``token_ids``."""
    parent = blake3(KEY_SCHEME.encode() + namespace + salt).digest(DIGEST_SIZE)
    keys: list[BlockKey] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        parent = blake3(parent + struct.pack(f"<{block_size}I", *block)).digest(DIGEST_SIZE)
        keys.append(BlockKey(parent))
    return keys


def store_key(key: BlockKey, rank: int) -> StoreKey:
    """The key one tensor-parallel rank stores its shard of a block under."""
    return StoreKey(blake3(key + struct.pack("<H", rank)).digest(DIGEST_SIZE))
