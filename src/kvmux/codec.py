"""Self-describing, checksummed entry format for one KV block (all layers).

Layout, little-endian::

    magic "KVMX" | version u16 | flags u16 | header_len u32 | header (JSON, UTF-8)
    | payload (layer 0 bytes, layer 1 bytes, ...) | xxh3_64 of everything before, u64

The header holds the namespace id, the store key, each layer's shape and dtype, and
the payload length. Decoding checks every field and the checksum; any mismatch raises
CorruptEntry. Stored bytes are only ever parsed as JSON and raw tensor bytes: never
pickle, torch.load or eval.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from kvmux.errors import CorruptEntry

__all__ = ["FORMAT_VERSION", "MAGIC", "DecodedEntry", "LayerSpec", "decode", "encode"]

MAGIC = b"KVMX"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sHHI")
_TRAILER = struct.Struct("<Q")
_MAX_HEADER = 1 << 20
_DTYPE_SIZES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class LayerSpec:
    """Shape and dtype of one layer's slice of a block."""

    shape: tuple[int, ...]
    dtype: str  # one of the names in _DTYPE_SIZES

    @property
    def nbytes(self) -> int:
        """Number of payload bytes this layer occupies."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * _DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class DecodedEntry:
    """A verified entry: its layers and a zero-copy view of the payload."""

    layers: tuple[LayerSpec, ...]
    payload: memoryview

    def layer_offsets(self) -> list[int]:
        """Byte offset of each layer inside the payload."""
        offsets, position = [], 0
        for layer in self.layers:
            offsets.append(position)
            position += layer.nbytes
        return offsets


def encode(
    namespace: bytes, key: bytes, layers: Sequence[LayerSpec], parts: Sequence[memoryview | bytes]
) -> bytes:
    """Serialise one block: ``parts`` are the layers' raw bytes in order."""
    for layer in layers:
        if layer.dtype not in _DTYPE_SIZES:
            raise ValueError(f"unsupported dtype {layer.dtype!r}")
    payload_len = sum(memoryview(p).nbytes for p in parts)
    if payload_len != sum(layer.nbytes for layer in layers):
        raise ValueError("payload length does not match the layer shapes")
    header = json.dumps(
        {
            "ns": namespace.hex(),
            "key": key.hex(),
            "layers": [[list(layer.shape), layer.dtype] for layer in layers],
            "payload_len": payload_len,
        },
        separators=(",", ":"),
    ).encode()
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header))
    digest = xxhash.xxh3_64()
    digest.update(prefix)
    digest.update(header)
    for part in parts:
        digest.update(part)
    return b"".join([prefix, header, *parts, _TRAILER.pack(digest.intdigest())])


def decode(data: bytes | memoryview, namespace: bytes, key: bytes) -> DecodedEntry:
    """Verify and parse an entry written by ``encode`` for this namespace and key."""
    view = memoryview(data)
    if view.nbytes < _PREFIX.size + _TRAILER.size:
        raise CorruptEntry("entry shorter than its fixed header")
    magic, version, _flags, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CorruptEntry("bad magic")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"unsupported format version {version}")
    if header_len > _MAX_HEADER or _PREFIX.size + header_len + _TRAILER.size > view.nbytes:
        raise CorruptEntry("header length out of range")
    body_end = view.nbytes - _TRAILER.size
    (stored_digest,) = _TRAILER.unpack_from(view, body_end)
    if xxhash.xxh3_64_intdigest(view[:body_end]) != stored_digest:
        raise CorruptEntry("checksum mismatch")
    header_end = _PREFIX.size + header_len
    layers, payload_len = _parse_header(bytes(view[_PREFIX.size : header_end]), namespace, key)
    if payload_len != body_end - header_end:
        raise CorruptEntry("payload length does not match the header")
    return DecodedEntry(layers=layers, payload=view[header_end:body_end])


def _parse_header(raw: bytes, namespace: bytes, key: bytes) -> tuple[tuple[LayerSpec, ...], int]:
    try:
        header = json.loads(raw)
        if header["ns"] != namespace.hex():
            raise CorruptEntry("entry belongs to another namespace")
        if header["key"] != key.hex():
            raise CorruptEntry("entry stored under another key")
        layers = tuple(
            LayerSpec(shape=tuple(int(d) for d in shape), dtype=str(dtype))
            for shape, dtype in header["layers"]
        )
        payload_len = int(header["payload_len"])
    except CorruptEntry:
        raise
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise CorruptEntry(f"malformed header: {exc}") from exc
    for layer in layers:
        if layer.dtype not in _DTYPE_SIZES or any(d < 0 for d in layer.shape):
            raise CorruptEntry(f"bad layer spec {layer}")
    if payload_len != sum(layer.nbytes for layer in layers):
        raise CorruptEntry("payload length does not match the layer shapes")
    return layers, payload_len
