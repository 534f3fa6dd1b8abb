"""What the tools read of one entry: its self-describing header, and its verification.

The header is read from the entry's first bytes (``peek``), bounded like the codec's own
parse: at most ``MAX_HEADER`` bytes of JSON, integers of at most 20 digits, no floats.
Garbage yields None, never an exception. ``check`` verifies a whole entry through
``kvmux.codec.decode``, the path every load takes, against the namespace its header
names and the key it is stored under.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import TypeGuard

from kvmux import codec
from kvmux.codec import SigningKeys
from kvmux.errors import CorruptEntry, UnverifiedEntry

__all__ = ["BAD", "HEAD_BYTES", "UNVERIFIED", "Header", "check", "header_end", "peek"]

HEAD_BYTES = 4096  # first read of an entry; a longer header is read again, whole
MAX_HEADER = 1 << 20  # the codec refuses longer headers
_PREFIX = struct.Struct("<4sHHI")  # magic, version, flags, header length (see codec)
_HEX = re.compile(r"(?:[0-9a-f]{2}){1,64}")
BAD = frozenset({"corrupt", "forged", "oversized", "unreadable"})  # always bad
UNVERIFIED = frozenset({"unsigned", "unknown-key"})  # bad with --strict


@dataclass(frozen=True)
class Header:
    """The fields of an entry's header the tools show; unverified until ``check``."""

    version: int
    signed: bool  # the SIGNED flag: a MAC follows the payload
    namespace: str  # hex namespace id
    key: str  # hex key the entry was written for
    kid: str | None  # id of the signing key
    layers: int  # number of layers in the block
    payload_len: int


def header_end(head: bytes) -> int | None:
    """Bytes from the entry's start to its header's end, or None if no entry starts so."""
    if len(head) < _PREFIX.size:
        return None
    magic, _, _, length = _PREFIX.unpack_from(head)
    if magic != codec.MAGIC or length > MAX_HEADER:
        return None
    return _PREFIX.size + int(length)


def peek(head: bytes) -> Header | None:
    """The header at the start of ``head``, or None if it cannot be read."""
    end = header_end(head)
    if end is None or end > len(head):
        return None
    _, version, flags, _ = _PREFIX.unpack_from(head)
    fields = _load_json(head[_PREFIX.size : end])
    if not isinstance(fields, dict):
        return None
    namespace, key, kid = fields.get("ns"), fields.get("key"), fields.get("kid")
    layers, payload = fields.get("layers"), fields.get("payload_len")
    if not (_is_hex(namespace) and _is_hex(key) and isinstance(layers, list)):
        return None
    if type(payload) is not int or not (kid is None or isinstance(kid, str)):
        return None
    signed = bool(flags & codec.SIGNED)
    return Header(version, signed, namespace, key, kid[:64] if kid else None, len(layers), payload)


def _is_hex(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and _HEX.fullmatch(value) is not None


def _load_json(raw: bytes) -> object:
    """JSON with short integers only, or None: the codec's bounds on untrusted headers."""
    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_int=_short_int, parse_float=_refuse, parse_constant=_refuse)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeError too
        return None


def _short_int(literal: str) -> int:
    if len(literal) > 20:
        raise ValueError("integer literal too long")
    return int(literal)


def _refuse(literal: str) -> int:
    raise ValueError("non-integer number")


def check(
    data: bytes, key: bytes, header: Header | None, signing: SigningKeys | None
) -> tuple[str, str]:
    """(status, reason) of one whole entry: ``ok``, a ``BAD`` or an ``UNVERIFIED`` status.

    Without ``signing`` a signed entry's checksum is checked, not its MAC.
    """
    namespace = bytes.fromhex(header.namespace) if header else b""
    try:
        codec.decode(data, namespace, key)
    except CorruptEntry as exc:
        return "corrupt", str(exc)
    if signing is None or header is None:
        return "ok", ""
    if not header.signed:
        return "unsigned", "entry is not signed"
    if header.kid not in signing.keys:
        return "unknown-key", f"signed with key {header.kid!r}, which the tier does not hold"
    try:
        codec.decode(data, namespace, key, signing)
    except UnverifiedEntry as exc:
        return "forged", str(exc)
    return "ok", ""
