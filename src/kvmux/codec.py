"""Self-describing, checksummed, optionally signed entry format for one KV block.

Layout, little-endian::

    magic "KVMX" | version u16 | flags u16 | header_len u32 | header (JSON, UTF-8)
    | payload (layer 0 bytes, layer 1 bytes, ...) | [MAC, 32 bytes, when flags & SIGNED]
    | xxh3_64 of everything before, u64

The checksum catches accidents, not forgery. A signed entry carries the id of its key
in the header (``kid``) and a keyed BLAKE3 MAC of everything before the MAC; with signing
on, an entry without a valid MAC from a known key is an ``UnverifiedEntry``.

The header holds the namespace id, the store key, each layer's shape and dtype, and
the payload length. Decoding checks every field and the checksum; any mismatch raises
CorruptEntry, and nothing else, whatever the input. Stored bytes are only ever parsed as
JSON (integers only, of at most 20 digits) and raw tensor bytes: never pickle, torch.load
or eval. Decoding costs time and memory linear in the input.
"""

from __future__ import annotations

import hmac
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import xxhash
from blake3 import blake3

from kvmux.errors import CorruptEntry, UnverifiedEntry

__all__ = [
    "FORMAT_VERSION",
    "MAC_SIZE",
    "MAGIC",
    "SIGNED",
    "DecodedEntry",
    "LayerSpec",
    "SigningKeys",
    "decode",
    "encode",
    "encode_parts",
]

MAGIC = b"KVMX"
FORMAT_VERSION = 1
SIGNED = 1  # flags bit: a MAC follows the payload
MAC_SIZE = 32
_MAC_CONTEXT = "kvmux 2026 entry signing key v1"  # BLAKE3 key derivation context
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_PREFIX = struct.Struct("<4sHHI")
_TRAILER = struct.Struct("<Q")
_MAX_HEADER = 1 << 20
_MAX_NDIM = 32  # dimensions of one layer's shape
_MAX_DIM = 2**63 - 1  # one dimension fits an int64, as tensor libraries need
_MAX_SIZE = 2**64 - 1  # a payload length (the u64 range)
_MAX_INT_DIGITS = 20  # digits of the longest integer literal a header may hold (2**64 - 1)
_LONG_INT = re.compile(rb"(?:^|[:\[,])\s*-?\d{%d}" % (_MAX_INT_DIGITS + 1))  # a longer number token
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


@dataclass(frozen=True)
class SigningKeys:
    """Keys of signed entries: ``signing_id``'s signs, every one verifies (for rotation)."""

    signing_id: str
    keys: Mapping[str, bytes]  # key id -> 32-byte BLAKE3 key derived from the secret

    @classmethod
    def parse(cls, text: str) -> SigningKeys:
        """``id:hexsecret`` entries, one per line (or comma-separated); the first signs.

        Raises ValueError naming what is wrong, never echoing a secret.
        """
        entries = [e.strip() for e in re.split(r"[\n,]", text) if e.strip()]
        entries = [e for e in entries if not e.startswith("#")]
        if not entries:
            raise ValueError("no key: expected lines of id:hexsecret")
        keys: dict[str, bytes] = {}
        for number, entry in enumerate(entries, start=1):
            kid, _, secret = entry.partition(":")
            if not _KEY_ID.fullmatch(kid) or kid in keys:
                raise ValueError(f"key {number}: bad or repeated id (letters, digits, _ . -)")
            try:
                raw = bytes.fromhex(secret)
            except ValueError:
                raise ValueError(f"key {number} ({kid}): the secret is not hex") from None
            if len(raw) < 16:
                raise ValueError(f"key {number} ({kid}): the secret needs 16 bytes or more")
            keys[kid] = blake3(raw, derive_key_context=_MAC_CONTEXT).digest()
        return cls(signing_id=next(iter(keys)), keys=keys)


def _mac(key: bytes, pieces: Sequence[memoryview | bytes]) -> bytes:
    digest = blake3(key=key)
    for piece in pieces:
        digest.update(piece)
    return digest.digest(MAC_SIZE)


def encode(
    namespace: bytes,
    key: bytes,
    layers: Sequence[LayerSpec],
    parts: Sequence[memoryview | bytes],
    signing: SigningKeys | None = None,
) -> bytes:
    """Serialise one block: ``parts`` are the layers' raw bytes in order; signed if asked."""
    return b"".join(encode_parts(namespace, key, layers, parts, signing))


def encode_parts(
    namespace: bytes,
    key: bytes,
    layers: Sequence[LayerSpec],
    parts: Sequence[memoryview | bytes],
    signing: SigningKeys | None = None,
) -> list[memoryview | bytes]:
    """``encode`` as the pieces whose concatenation is the entry, without copying ``parts``."""
    for layer in layers:
        if layer.dtype not in _DTYPE_SIZES:
            raise ValueError(f"unsupported dtype {layer.dtype!r}")
        if len(layer.shape) > _MAX_NDIM or not all(_is_size(d, _MAX_DIM) for d in layer.shape):
            raise ValueError(f"unsupported shape {layer.shape!r}")
    payload_len = sum(memoryview(p).nbytes for p in parts)
    if payload_len != sum(layer.nbytes for layer in layers):
        raise ValueError("payload length does not match the layer shapes")
    fields: dict[str, object] = {
        "ns": namespace.hex(),
        "key": key.hex(),
        "layers": [[list(layer.shape), layer.dtype] for layer in layers],
        "payload_len": payload_len,
    }
    if signing is not None:
        fields["kid"] = signing.signing_id
    header = json.dumps(fields, separators=(",", ":")).encode()
    flags = SIGNED if signing is not None else 0
    pieces: list[memoryview | bytes] = [_PREFIX.pack(MAGIC, FORMAT_VERSION, flags, len(header))]
    pieces += [header, *parts]
    if signing is not None:
        pieces.append(_mac(signing.keys[signing.signing_id], pieces))
    digest = xxhash.xxh3_64()
    for piece in pieces:
        digest.update(piece)
    pieces.append(_TRAILER.pack(digest.intdigest()))
    return pieces


def decode(
    data: bytes | bytearray | memoryview,
    namespace: bytes,
    key: bytes,
    signing: SigningKeys | None = None,
) -> DecodedEntry:
    """Verify and parse an entry written by ``encode`` for this namespace and key.

    With ``signing``, an entry must also carry a valid MAC from one of its keys.
    """
    view = _byte_view(data)
    if view.nbytes < _PREFIX.size + _TRAILER.size:
        raise CorruptEntry("entry shorter than its fixed header")
    magic, version, flags, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CorruptEntry("bad magic")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"unsupported format version {version}")
    if flags & ~SIGNED:
        raise CorruptEntry(f"unknown flags {flags:#x}")
    if header_len > _MAX_HEADER or _PREFIX.size + header_len + _TRAILER.size > view.nbytes:
        raise CorruptEntry("header length out of range")
    body_end = view.nbytes - _TRAILER.size
    (stored_digest,) = _TRAILER.unpack_from(view, body_end)
    if xxhash.xxh3_64_intdigest(view[:body_end]) != stored_digest:
        raise CorruptEntry("checksum mismatch")
    header_end = _PREFIX.size + header_len
    payload_end = body_end - (MAC_SIZE if flags & SIGNED else 0)
    raw_header = bytes(view[_PREFIX.size : header_end])
    layers, payload_len, kid = _parse_header(raw_header, namespace, key)
    if payload_len != payload_end - header_end:
        raise CorruptEntry("payload length does not match the header")
    if signing is not None:
        _verify(signing, flags, kid, view, payload_end, body_end)
    return DecodedEntry(layers=layers, payload=view[header_end:payload_end])


def _verify(
    signing: SigningKeys, flags: int, kid: str | None, view: memoryview, end: int, body_end: int
) -> None:
    if not flags & SIGNED:
        raise UnverifiedEntry("entry is not signed")
    if kid is None or kid not in signing.keys:
        raise UnverifiedEntry("entry is signed with a key this engine does not hold")
    if not hmac.compare_digest(_mac(signing.keys[kid], [view[:end]]), view[end:body_end]):
        raise UnverifiedEntry("entry signature does not verify")


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    """A flat unsigned-byte view of ``data``, whatever the format of the buffer."""
    try:
        return memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise CorruptEntry(f"entry is not a contiguous byte buffer: {exc}") from exc


def _parse_header(
    raw: bytes, namespace: bytes, key: bytes
) -> tuple[tuple[LayerSpec, ...], int, str | None]:
    """Layers, payload length and signing key id (None if absent) of a checked header."""
    header = _load_json(raw)
    if not isinstance(header, dict):
        raise CorruptEntry("malformed header: not a JSON object")
    if header.get("ns") != namespace.hex():
        raise CorruptEntry("entry belongs to another namespace")
    if header.get("key") != key.hex():
        raise CorruptEntry("entry stored under another key")
    no_booleans = b"true" not in raw and b"false" not in raw
    layers = _parse_layers(header.get("layers"), strict_types=not no_booleans)
    payload_len = header.get("payload_len")
    if not _is_size(payload_len, _MAX_SIZE):
        raise CorruptEntry(f"malformed header: bad payload length {_describe(payload_len)}")
    if payload_len != sum(layer.nbytes for layer in layers):
        raise CorruptEntry("payload length does not match the layer shapes")
    kid = header.get("kid")
    return layers, payload_len, kid if isinstance(kid, str) else None


def _load_json(raw: bytes) -> object:
    """JSON with short integer literals only: no floats, NaN or Infinity, no bignums."""
    try:
        # integers are parsed by json's own C parser, once no number literal is longer
        # than _MAX_INT_DIGITS (a bignum costs quadratic time); each is checked against
        # its field's range afterwards (_is_size)
        if _LONG_INT.search(raw):
            raise ValueError(f"an integer literal of more than {_MAX_INT_DIGITS} digits")
        return json.loads(
            raw.decode("utf-8"), parse_float=_refuse_number, parse_constant=_refuse_number
        )
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeError too
        raise CorruptEntry(f"malformed header: {exc}") from exc


def _refuse_number(literal: str) -> int:
    raise ValueError(f"non-integer number {literal[:40]}")


# the last layer list parsed and its specs: a tier's entries repeat one list (a block's
# layers, or one head's), so most headers compare equal to it instead of parsing again
_last_layers: tuple[list[object], tuple[LayerSpec, ...]] = ([], ())


def _parse_layers(raw: object, strict_types: bool = True) -> tuple[LayerSpec, ...]:
    """The layer specs of a header's ``layers``. Unless ``strict_types`` (the header may
    hold a boolean, which compares equal to 0 or 1), a list equal to the last one parsed
    takes its specs."""
    global _last_layers
    if not isinstance(raw, list):
        raise CorruptEntry("malformed header: layers is not a list")
    last = _last_layers
    if not strict_types and raw == last[0]:
        return last[1]
    specs = tuple(_parse_layer(item) for item in raw)
    _last_layers = (raw, specs)
    return specs


def _parse_layer(item: object) -> LayerSpec:
    if not isinstance(item, list) or len(item) != 2:
        raise CorruptEntry("malformed header: a layer is not [shape, dtype]")
    shape, dtype = item
    if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
        raise CorruptEntry(f"bad layer dtype {_describe(dtype)}")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(_is_size(d, _MAX_DIM) for d in shape)
    ):
        raise CorruptEntry(f"bad layer shape {_describe(shape)}")
    return LayerSpec(shape=tuple(shape), dtype=dtype)


def _is_size(value: object, limit: int) -> TypeGuard[int]:
    """Whether ``value`` is a plain int (not a bool) in ``[0, limit]``."""
    return type(value) is int and 0 <= value <= limit


def _describe(value: object) -> str:
    """A short, safe description of an untrusted header value (never its full repr)."""
    if isinstance(value, str):
        return repr(value[:40])
    if type(value) is int:
        return str(value)  # at most _MAX_INT_DIGITS digits (_LONG_INT)
    if isinstance(value, list):
        return f"(a list of {len(value)} items)"
    return f"of type {type(value).__name__}"
