"""Real entries for the operators' tools tests: encoded by the codec, keyed by the key scheme."""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass

import xxhash

from kvmux import codec
from kvmux.codec import LayerSpec, SigningKeys
from kvmux.keys import block_keys, namespace_id, store_key
from kvmux.stores import KVStore

__all__ = ["Written", "reframe", "signing_keys", "write_model"]

LAYERS = (LayerSpec((2, 16, 2, 8), "float16"), LayerSpec((2, 16, 2, 8), "float16"))


@dataclass(frozen=True)
class Written:
    """Entries written for one model: its namespace id and the store keys."""

    namespace: bytes
    keys: list[bytes]
    values: dict[bytes, bytes]


def signing_keys(*ids: str, seed: int = 0) -> SigningKeys:
    """Keys with these ids and secrets derived from ``seed``; the first signs."""
    rng = random.Random(seed)
    return SigningKeys.parse("\n".join(f"{kid}:{rng.randbytes(16).hex()}" for kid in ids))


def write_model(
    store: KVStore,
    model: str,
    blocks: int,
    signing: SigningKeys | None = None,
    rank: int = 0,
    layers: tuple[LayerSpec, ...] = LAYERS,
) -> Written:
    """Store ``blocks`` entries of a prompt as a tier of ``model`` would."""
    namespace = namespace_id({"model": model, "entries": "signed" if signing else "plain"})
    rng = random.Random(f"{model}-{rank}")
    values = {}
    for key in block_keys(namespace, list(range(16 * blocks)), 16):
        skey = store_key(key, rank)
        parts = [rng.randbytes(layer.nbytes) for layer in layers]
        values[skey] = codec.encode(namespace, skey, layers, parts, signing)
        assert store.put(skey, values[skey])
    return Written(namespace, list(values), values)


def reframe(entry: bytes, **header: object) -> bytes:
    """``entry`` with header fields replaced and a recomputed checksum (a MAC stays stale)."""
    prefix = struct.Struct("<4sHHI")
    magic, version, flags, length = prefix.unpack_from(entry)
    fields = json.loads(entry[prefix.size : prefix.size + length])
    fields.update(header)
    raw = json.dumps(fields, separators=(",", ":")).encode()
    body = prefix.pack(magic, version, flags, len(raw)) + raw + entry[prefix.size + length : -8]
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
