"""How the Redis store splits a large entry: a manifest at the entry's key names its parts.

A manifest value is ``MANIFEST_PREFIX | part count u32 | total length u64 | nonce 16 bytes``
and part ``n`` (from 1) holds bytes ``[(n - 1) * max_value_size, n * max_value_size)``.

Whoever can write to a shared server can write any manifest, so one is believed only
if it is exactly what this store could have written: the exact length, a total of at
most ``MAX_ENTRY_SIZE`` bytes (and at most the reader's ``value_limit``), and
``ceil(total / max_value_size)`` parts, at most ``MAX_PARTS``. Anything else is a miss,
so reading a split entry costs at most ``MAX_PARTS`` commands and ``total`` bytes (plus
one per part), whatever the server holds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "MANIFEST_PREFIX",
    "MANIFEST_SIZE",
    "MAX_ENTRY_SIZE",
    "MAX_PARTS",
    "Manifest",
    "fits",
    "is_manifest",
    "parse_manifest",
    "part_count",
    "part_name",
    "unchecked_manifest",
]

MANIFEST_PREFIX = b"\x00kvmux-parts-v1\x00"
_BODY = struct.Struct("<IQ16s")  # part count, total length, write nonce
MANIFEST_SIZE = len(MANIFEST_PREFIX) + _BODY.size
MAX_ENTRY_SIZE = 1 << 30  # largest entry that is split into parts (a KV block is far smaller)
MAX_PARTS = 4096  # most parts of one entry: bounds the commands one load sends


@dataclass(frozen=True)
class Manifest:
    """A split entry: its number of parts, its length in bytes and its writer's nonce."""

    count: int
    total: int
    nonce: bytes

    def pack(self) -> bytes:
        """The value stored at the entry's own key."""
        return MANIFEST_PREFIX + _BODY.pack(self.count, self.total, self.nonce)

    def part_sizes(self, max_value_size: int) -> list[int]:
        """The exact length of each part, in order."""
        last = self.total - (self.count - 1) * max_value_size
        return [max_value_size] * (self.count - 1) + [last]

    def head_sizes(self, max_value_size: int, size: int) -> list[int]:
        """Bytes to read of each part, in order, for the entry's first ``size`` bytes."""
        sizes, left = [], size
        for part in self.part_sizes(max_value_size):
            if left <= 0:
                break
            sizes.append(min(part, left))
            left -= part
        return sizes


def part_name(name: str, nonce: bytes, index: int) -> str:
    """The Redis key of part ``index`` (from 1) of the entry at ``name``, by one writer."""
    return f"{name}:{nonce.hex()}:{index}"


def part_count(total: int, max_value_size: int) -> int:
    """How many parts an entry of ``total`` bytes is split into."""
    return -(-total // max_value_size)


def fits(total: int, max_value_size: int) -> bool:
    """Whether an entry of ``total`` bytes can be stored, whole or split, and read back."""
    if total <= max_value_size:
        return True
    return total <= MAX_ENTRY_SIZE and part_count(total, max_value_size) <= MAX_PARTS


def is_manifest(value: bytes) -> bool:
    """Whether ``value`` claims to be a manifest (it may still be malformed)."""
    return value.startswith(MANIFEST_PREFIX)


def parse_manifest(
    value: bytes, max_value_size: int, max_total: int | None = None
) -> Manifest | None:
    """The manifest in ``value``, or None unless it is one this store could have written.

    ``max_total``: the largest entry the reader accepts (``KVStore.value_limit``).
    """
    if len(value) != MANIFEST_SIZE or not is_manifest(value) or max_value_size < 1:
        return None
    count, total, nonce = _BODY.unpack_from(value, len(MANIFEST_PREFIX))
    largest = MAX_ENTRY_SIZE if max_total is None else min(max_total, MAX_ENTRY_SIZE)
    if not 1 <= total <= largest or count > MAX_PARTS:
        return None
    if count != part_count(total, max_value_size):
        return None
    return Manifest(count=count, total=total, nonce=nonce)


def unchecked_manifest(value: bytes) -> Manifest | None:
    """The fields of a manifest-shaped value, unchecked (only to name a writer's part size)."""
    if len(value) != MANIFEST_SIZE or not is_manifest(value):
        return None
    count, total, nonce = _BODY.unpack_from(value, len(MANIFEST_PREFIX))
    return Manifest(count=count, total=total, nonce=nonce)
