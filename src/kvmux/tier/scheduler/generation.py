"""A tier's generation: a random id that every key is rooted in, replaced by each reset.

The store keeps one record of it (``read_generation``/``write_generation``), so every
engine sharing the tier follows a reset. A record reads
``kvmux-generation-v2 <sequence> <32 hex id>`` and, on a signed tier,
`` <key id> <64 hex MAC>`` after it (a keyed BLAKE3 MAC, its key derived from the
signing key for this use alone). Generations are ordered by (sequence, id): an engine
only ever moves forward, so it never returns to a generation it has left, whatever the
store says later, and engines that disagree converge on the greatest. A reset moves to
the next sequence number. A record that is absent, malformed, unsigned or forged is
replaced by a new generation (nothing stored before it is served), never trusted; an
older valid one is overwritten by the engine's own.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading

from blake3 import blake3

from kvmux.codec import SigningKeys
from kvmux.stores.base import GENERATION_RECORD_MAX

__all__ = [
    "GENERATION_BYTES",
    "Generation",
    "GenerationTracker",
    "decode_generation",
    "decode_record",
    "encode_record",
    "new_generation",
]

GENERATION_BYTES = 16
_MAGIC = b"kvmux-generation-v2"
_MAC_BYTES = 32
_MAC_CONTEXT = b"kvmux generation record"  # the MAC key: the signing key's, for this use
_SEQUENCE_MAX = 2**63 - 1
_RECORD = re.compile(
    rb"kvmux-generation-v2 (0|[1-9][0-9]{0,18}) ([0-9a-f]{32})"
    rb"(?: ([A-Za-z0-9_.\-]{1,64}) ([0-9a-f]{64}))?\n?"
)

Generation = tuple[int, bytes]  # (sequence, id): ordered, the greatest is followed


def new_generation() -> bytes:
    """A fresh random generation id (never all zeros)."""
    while True:
        generation = secrets.token_bytes(GENERATION_BYTES)
        if any(generation):
            return generation


def _mac(key: bytes, body: bytes) -> bytes:
    record_key = blake3(_MAC_CONTEXT, key=key).digest(32)
    return blake3(body, key=record_key).digest(_MAC_BYTES)


def encode_record(generation: bytes, signing: SigningKeys | None, sequence: int = 1) -> bytes:
    """The record naming ``generation`` at ``sequence``, signed if there is a key."""
    body = _MAGIC + b" " + str(sequence).encode() + b" " + generation.hex().encode()
    if signing is None:
        return body + b"\n"
    kid = signing.signing_id
    mac = _mac(signing.keys[kid], body + b" " + kid.encode())
    return body + b" " + kid.encode() + b" " + mac.hex().encode() + b"\n"


def decode_generation(raw: object, signing: SigningKeys | None) -> Generation | None:
    """(sequence, id) a record names, or None: absent, malformed, unsigned or forged.

    Takes any value (a store may hold anything); never raises.
    """
    if not isinstance(raw, bytes) or len(raw) > GENERATION_RECORD_MAX:
        return None
    match = _RECORD.fullmatch(raw)
    if match is None:
        return None
    sequence, generation, kid, mac = match.groups()
    if signing is not None:
        if kid is None or mac is None:
            return None
        key = signing.keys.get(kid.decode())
        body = _MAGIC + b" " + sequence + b" " + generation + b" " + kid
        if key is None or not hmac.compare_digest(_mac(key, body).hex().encode(), mac):
            return None
    number, ident = int(sequence), bytes.fromhex(generation.decode())
    if number > _SEQUENCE_MAX or not any(ident):
        return None
    return number, ident


def decode_record(raw: object, signing: SigningKeys | None) -> bytes | None:
    """The generation id a record names, or None (see ``decode_generation``)."""
    named = decode_generation(raw, signing)
    return None if named is None else named[1]


class GenerationTracker:
    """One engine's generation of a tier: it only ever moves forward (see the module).

    Thread-safe: a remote tier reads its record on a thread of its own. ``resets``
    counts this engine's resets, so a read that began before one is ignored.
    """

    def __init__(self, signing: SigningKeys | None = None):
        self._signing = signing
        self._current: Generation | None = None
        self._lock = threading.Lock()
        self.resets = 0

    @property
    def current(self) -> bytes | None:
        """The generation id new requests are keyed in; None until one is known."""
        current = self._current
        return None if current is None else current[1]

    def _record(self) -> bytes | None:
        current = self._current
        if current is None:
            return None
        return encode_record(current[1], self._signing, current[0])

    def observe(self, raw: object, resets_seen: int) -> tuple[bytes | None, bytes | None]:
        """Follow what the store holds; (current generation, record to write or None).

        ``resets_seen``: ``resets`` when the read began; a read older than this engine's
        last reset changes nothing. A valid record of a greater generation is followed;
        one of a lesser one is overwritten with the current record; an absent, malformed
        or unverifiable one gives way to a new generation, written.
        """
        with self._lock:
            if resets_seen != self.resets:
                return self.current, None
            named = decode_generation(raw, self._signing)
            if named is not None and (self._current is None or named > self._current):
                self._current = named
                return self.current, None
            if named is not None and named == self._current:
                return self.current, None
            # an absent record (a server restarted empty) is written back as it was; one
            # that is there but not valid gives way to a new generation
            if named is None and (raw is not None or self._current is None):
                self._current = (self._next_sequence(), new_generation())
            return self.current, self._record()

    def reset(self, raw: object = None) -> bytes:
        """Leave the current generation (after catching up with ``raw``, the store's
        record if read just before) for a new one; the record to write."""
        with self._lock:
            named = decode_generation(raw, self._signing)
            if named is not None and (self._current is None or named > self._current):
                self._current = named
            self.resets += 1
            self._current = (self._next_sequence(), new_generation())
            record = self._record()
            assert record is not None
            return record

    def is_current(self, record: bytes) -> bool:
        """Whether ``record`` names the current generation (a write-back still due)."""
        with self._lock:
            return record == self._record()

    def _next_sequence(self) -> int:
        sequence = 0 if self._current is None else self._current[0]
        return min(sequence + 1, _SEQUENCE_MAX)
