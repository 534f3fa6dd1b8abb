"""Seeded byte mutations for the fuzz tests: flips, truncations, extensions, splices."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

__all__ = ["INTERESTING_INTS", "mutate", "random_bytes"]

INTERESTING_INTS = (0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63, 2**64 - 1)
_WIDTHS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def random_bytes(rng: random.Random, max_length: int) -> bytes:
    """Uniformly random bytes of a random length up to ``max_length``."""
    return rng.randbytes(rng.randrange(max_length + 1))


def _flip_bits(rng: random.Random, data: bytearray) -> None:
    for _ in range(rng.choice((1, 1, 2, 8))):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)


def _set_byte(rng: random.Random, data: bytearray) -> None:
    data[rng.randrange(len(data))] = rng.choice((0, 0x7F, 0x80, 0xFF, rng.randrange(256)))


def _truncate(rng: random.Random, data: bytearray) -> None:
    del data[rng.randrange(len(data)) :]


def _extend(rng: random.Random, data: bytearray) -> None:
    data.extend(rng.choice((b"\x00", data[-8:], rng.randbytes(rng.randrange(1, 64)))))


def _insert(rng: random.Random, data: bytearray) -> None:
    at = rng.randrange(len(data) + 1)
    data[at:at] = rng.randbytes(rng.randrange(1, 16))


def _delete_span(rng: random.Random, data: bytearray) -> None:
    at = rng.randrange(len(data))
    del data[at : at + rng.randrange(1, 16)]


def _duplicate_span(rng: random.Random, data: bytearray) -> None:
    at = rng.randrange(len(data))
    span = data[at : at + rng.randrange(1, 32)]
    to = rng.randrange(len(data) + 1)
    data[to:to] = span


def _overwrite_int(rng: random.Random, data: bytearray) -> None:
    width = rng.choice(tuple(_WIDTHS))
    value = rng.choice(INTERESTING_INTS) & ((1 << (8 * width)) - 1)
    if len(data) >= width:
        struct.pack_into(_WIDTHS[width], data, rng.randrange(len(data) - width + 1), value)


_MUTATIONS: tuple[Callable[[random.Random, bytearray], None], ...] = (
    _flip_bits,
    _set_byte,
    _truncate,
    _extend,
    _insert,
    _delete_span,
    _duplicate_span,
    _overwrite_int,
)


def mutate(rng: random.Random, data: bytes) -> bytes:
    """``data`` after one to three random mutations (an empty input only grows)."""
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if out:
            rng.choice(_MUTATIONS)(rng, out)
        else:
            _extend(rng, out)
    return bytes(out)
