"""Deterministic, chained, namespaced block keys: the one place kvmux hashes.

Scheme (version ``kvmux-keys-v2``, hash BLAKE3, 16-byte digests):

* ``namespace_id = blake3(canonical_json(namespace))[:16]`` where the namespace names
  everything that changes the bytes of a block: model and checkpoint identity,
  quantization, dtypes, KV shape and layout, block size, the pipeline-parallel layout,
  platform; not the tensor-parallel size (entries are per KV head).
* ``root = blake3("kvmux-keys-v2" | namespace_id | generation)``, where the generation
  is the tier's current 16-byte random id (``kvmux.tier.scheduler.generation``), replaced at each
  reset: after a reset no key of an earlier generation is ever asked for.
* ``key[i] = blake3(key[i-1] | uint32le(tokens of block i) | extra_keys(block i))`` with
  ``key[-1] = root``. The extra keys are exactly what vLLM folds into its own block
  hashes (LoRA name and path, multimodal item hashes and offsets, ``cache_salt``,
  prompt-embedding hashes), in a canonical encoding (``encode_extra_keys``); empty for a
  plain text block. The first two parts have a fixed size, so the message is unambiguous.
* ``group_key(key, g) = key`` for KV cache group 0 and ``blake3(key | "group" |
  uint16le(g))[:16]`` for a group ``g > 0`` of a hybrid model (e.g. its sliding-window
  layers): each group's layers of a block are one entry. A model with one group keeps
  the block key itself; the namespace of a model with several groups names every group.
* ``store_key(key, shard) = blake3(key | uint16le(shard))[:16]``: a block is stored in
  shards, one per KV head of each pipeline stage's layers (``kvmux.tier.shards``), so that
  engines of any tensor-parallel size read and write the same entries.

Nothing depends on PYTHONHASHSEED or process state, so keys agree across processes,
restarts and machines.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NewType

from blake3 import blake3

from kvmux.errors import UnkeyableInput

__all__ = [
    "KEY_SCHEME",
    "BlockKey",
    "StoreKey",
    "UnkeyableInput",
    "block_keys",
    "encode_extra_keys",
    "generation_namespace",
    "group_key",
    "namespace_id",
    "store_key",
]

KEY_SCHEME = "kvmux-keys-v2"
DIGEST_SIZE = 16

BlockKey = NewType("BlockKey", bytes)
StoreKey = NewType("StoreKey", bytes)


def namespace_id(namespace: Mapping[str, Any]) -> bytes:
    """Digest of a namespace mapping, independent of key order."""
    canonical = json.dumps(namespace, sort_keys=True, separators=(",", ":"), default=str)
    return blake3(canonical.encode()).digest(DIGEST_SIZE)


def encode_extra_keys(extra: Any) -> bytes:
    """A canonical, type-tagged encoding of one block's extra keys (tuples of scalars)."""
    parts: list[bytes] = []
    _encode(extra, parts)
    return b"".join(parts)


def _encode(value: Any, parts: list[bytes]) -> None:
    if value is None:
        parts.append(b"n")
    elif isinstance(value, bool):
        parts.append(b"T" if value else b"F")
    elif isinstance(value, int):
        text = str(value).encode()
        parts.append(b"i" + struct.pack("<I", len(text)) + text)
    elif isinstance(value, str | bytes):
        raw = value.encode() if isinstance(value, str) else value
        parts.append((b"s" if isinstance(value, str) else b"b") + struct.pack("<I", len(raw)))
        parts.append(raw)
    elif isinstance(value, tuple | list):
        parts.append(b"t" + struct.pack("<I", len(value)))
        for item in value:
            _encode(item, parts)
    else:
        raise UnkeyableInput(f"cannot key an extra key of type {type(value).__name__}")


def generation_namespace(namespace: bytes, generation: bytes) -> bytes:
    """The namespace bytes that keys of a tier's ``generation`` (its 16-byte id) are rooted in."""
    if len(generation) != DIGEST_SIZE:
        raise ValueError(f"a generation is {DIGEST_SIZE} bytes, not {len(generation)}")
    # the all-zero id, which no reset draws, is a view's without generations of its own
    return namespace if generation == bytes(DIGEST_SIZE) else namespace + generation


def block_keys(
    namespace: bytes,
    token_ids: Sequence[int],
    block_size: int,
    extras: Sequence[bytes] | None = None,
) -> list[BlockKey]:
    """Chained keys of every full block of ``token_ids``; ``extras[i]`` is block i's."""
    parent = blake3(KEY_SCHEME.encode() + namespace).digest(DIGEST_SIZE)
    keys: list[BlockKey] = []
    for index, start in enumerate(range(0, len(token_ids) - block_size + 1, block_size)):
        digest = blake3(
            parent + struct.pack(f"<{block_size}I", *token_ids[start : start + block_size])
        )
        if extras is not None and extras[index]:
            digest.update(extras[index])
        parent = digest.digest(DIGEST_SIZE)
        keys.append(BlockKey(parent))
    return keys


def group_key(key: BlockKey, group: int) -> BlockKey:
    """The key of KV cache group ``group``'s share of a block (group 0: the block key)."""
    if group == 0:
        return key
    return BlockKey(blake3(key + b"group" + struct.pack("<H", group)).digest(DIGEST_SIZE))


def store_key(key: BlockKey, shard: int) -> StoreKey:
    """The key one shard of a block (``kvmux.tier.shards``) is stored under."""
    return StoreKey(blake3(key + struct.pack("<H", shard)).digest(DIGEST_SIZE))
