"""A tier's generation: a random id that every key is rooted in, replaced by each reset.

The store keeps one record of it (``read_generation``/``write_generation``), so every
engine sharing the tier follows a reset. A record reads
``kvmux-generation-v1 <32 hex id>`` and, on a signed tier, `` <key id> <64 hex MAC>``
after it. An engine never returns to a generation it has left, whatever the store says
later; a record that is absent, malformed, unsigned or forged is replaced by a new
generation (nothing stored before it is served), never trusted.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
from collections import OrderedDict

from blake3 import blake3

from kvmux.codec import SigningKeys
from kvmux.stores.base import GENERATION_RECORD_MAX

__all__ = ["GENERATION_BYTES", "GenerationTracker", "decode_record", "encode_record"]

GENERATION_BYTES = 16
_MAGIC = b"kvmux-generation-v1"
_MAC_BYTES = 32
_RECORD = re.compile(
    rb"kvmux-generation-v1 ([0-9a-f]{32})(?: ([A-Za-z0-9_.\-]{1,64}) ([0-9a-f]{64}))?\n?"
)
_LEFT_KEPT = 4096  # generations an engine remembers having left


def new_generation() -> bytes:
    """A fresh random generation id."""
    return secrets.token_bytes(GENERATION_BYTES)


def _mac(key: bytes, body: bytes) -> bytes:
    return blake3(body, key=key).digest(_MAC_BYTES)


def encode_record(generation: bytes, signing: SigningKeys | None) -> bytes:
    """The record naming ``generation``, signed with the signing key if there is one."""
    body = _MAGIC + b" " + generation.hex().encode()
    if signing is None:
        return body + b"\n"
    kid = signing.signing_id
    mac = _mac(signing.keys[kid], body + b" " + kid.encode())
    return body + b" " + kid.encode() + b" " + mac.hex().encode() + b"\n"


def decode_record(raw: object, signing: SigningKeys | None) -> bytes | None:
    """The generation a record names, or None: absent, malformed, unsigned or forged.

    Takes any value (a store may hold anything); never raises.
    """
    if not isinstance(raw, bytes) or len(raw) > GENERATION_RECORD_MAX:
        return None
    match = _RECORD.fullmatch(raw)
    if match is None:
        return None
    generation, kid, mac = match.group(1), match.group(2), match.group(3)
    if signing is not None:
        if kid is None or mac is None:
            return None
        key = signing.keys.get(kid.decode())
        body = _MAGIC + b" " + generation + b" " + kid
        if key is None or not hmac.compare_digest(_mac(key, body).hex().encode(), mac):
            return None
    return bytes.fromhex(generation.decode())


class GenerationTracker:
    """One engine's generation of a tier: where it is, and every generation it has left.

    Thread-safe: a remote tier reads its record on a thread of its own. ``resets``
    counts this engine's resets, so a read that began before one is ignored.
    """

    def __init__(self, signing: SigningKeys | None = None):
        self._signing = signing
        self._current: bytes | None = None
        self._left: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self.resets = 0

    @property
    def current(self) -> bytes | None:
        """The generation new requests are keyed in; None until one is known."""
        return self._current

    def record(self) -> bytes | None:
        """The record of the current generation (what this engine writes back)."""
        current = self._current
        return None if current is None else encode_record(current, self._signing)

    def observe(self, raw: object, resets_seen: int) -> tuple[bytes | None, bytes | None]:
        """Follow what the store holds; (current generation, record to write or None).

        ``resets_seen``: ``resets`` when the read began; a read older than this engine's
        last reset changes nothing. A valid record of a generation not left is followed;
        one of a generation left is refused, and the current record is written back; an
        absent, malformed or unverifiable record gives way to a new generation, written.
        """
        with self._lock:
            if resets_seen != self.resets:
                return self._current, None
            named = decode_record(raw, self._signing)
            if named is not None and named == self._current:
                return named, None
            if named is not None and named not in self._left:
                self._move(named)
                return named, None
            current = new_generation() if named is None or self._current is None else self._current
            self._move(current)
            return current, encode_record(current, self._signing)

    def reset(self) -> bytes:
        """Leave the current generation for a new one; the record to write."""
        with self._lock:
            self.resets += 1
            current = new_generation()
            self._move(current)
            return encode_record(current, self._signing)

    def _move(self, generation: bytes) -> None:
        if self._current is not None and self._current != generation:
            self._left[self._current] = None
            while len(self._left) > _LEFT_KEPT:
                self._left.popitem(last=False)
        self._left.pop(generation, None)
        self._current = generation
