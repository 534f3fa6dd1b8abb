"""kvmux.codec signed entries: with signing on, only a valid MAC from a held key loads."""

from __future__ import annotations

import json
import random
import struct

import pytest
import xxhash

from kvmux.codec import MAC_SIZE, SIGNED, LayerSpec, SigningKeys, decode, encode
from kvmux.errors import CorruptEntry, UnverifiedEntry
from kvmux.keys import namespace_id

NS = namespace_id({"m": "x"})
KEY = bytes(range(16))
OTHER_KEY = bytes(range(1, 17))
LAYERS = (LayerSpec((2, 3), "float32"), LayerSpec((4,), "uint8"))
PARTS = (bytes(range(100, 124)), b"\x00\x01\xfe\xff")
OLD = SigningKeys.parse("k1:" + "11" * 32)
NEW = SigningKeys.parse("k2:" + "22" * 32 + "\nk1:" + "11" * 32)  # rotated: k2 signs, k1 verifies
STRANGER = SigningKeys.parse("k1:" + "33" * 32)  # same id, another secret


def _checksummed(body: bytes) -> bytes:
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def test_a_signed_entry_round_trips() -> None:
    entry = encode(NS, KEY, LAYERS, PARTS, OLD)
    assert struct.unpack_from("<H", entry, 6)[0] == SIGNED
    decoded = decode(entry, NS, KEY, OLD)
    assert bytes(decoded.payload) == b"".join(PARTS)
    assert bytes(decode(entry, NS, KEY).payload) == b"".join(PARTS)  # signing off: loads too


def test_with_signing_on_an_unsigned_entry_is_unverified() -> None:
    with pytest.raises(UnverifiedEntry, match="not signed"):
        decode(encode(NS, KEY, LAYERS, PARTS), NS, KEY, OLD)


def test_a_forged_entry_with_a_valid_checksum_is_unverified() -> None:
    """Whoever can write to the tier can recompute XXH3, but not the MAC."""
    entry = bytearray(encode(NS, KEY, LAYERS, PARTS, OLD))
    payload_at = len(entry) - 8 - MAC_SIZE - 4
    entry[payload_at] ^= 0xFF
    forged = _checksummed(bytes(entry[:-8]))
    with pytest.raises(UnverifiedEntry, match="does not verify"):
        decode(forged, NS, KEY, OLD)


def test_a_key_of_the_same_id_but_another_secret_does_not_verify() -> None:
    with pytest.raises(UnverifiedEntry):
        decode(encode(NS, KEY, LAYERS, PARTS, STRANGER), NS, KEY, OLD)


def test_rotation_old_entries_load_while_the_old_key_is_held() -> None:
    old_entry = encode(NS, KEY, LAYERS, PARTS, OLD)
    new_entry = encode(NS, KEY, LAYERS, PARTS, NEW)
    assert decode(old_entry, NS, KEY, NEW).layers == LAYERS
    assert json.loads(new_entry[12 : 12 + struct.unpack_from("<I", new_entry, 8)[0]])["kid"] == "k2"
    with pytest.raises(UnverifiedEntry, match="does not hold"):
        decode(new_entry, NS, KEY, OLD)  # an engine not yet given k2


def test_a_signed_entry_moved_to_another_key_is_refused() -> None:
    with pytest.raises(CorruptEntry):
        decode(encode(NS, KEY, LAYERS, PARTS, OLD), NS, OTHER_KEY, OLD)


def test_unknown_flags_are_refused() -> None:
    entry = bytearray(encode(NS, KEY, LAYERS, PARTS))
    struct.pack_into("<H", entry, 6, 0x4)
    with pytest.raises(CorruptEntry, match="flags"):
        decode(_checksummed(bytes(entry[:-8])), NS, KEY)


def test_mutated_signed_entries_never_escape_as_anything_else() -> None:
    rng = random.Random(7)
    entry = encode(NS, KEY, LAYERS, PARTS, NEW)
    accepted = 0
    for _ in range(20_000):
        data = bytearray(entry)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.5:  # re-checksum so that the mutation reaches the MAC
            data = bytearray(_checksummed(bytes(data[:-8])))
        try:
            decode(bytes(data), NS, KEY, NEW)
            accepted += 1
        except CorruptEntry:
            pass
    assert accepted <= 20_000 * 0.01  # only mutations that changed nothing (same byte)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no key"),
        ("k1", "16 bytes"),
        ("k1:zz", "not hex"),
        ("k1:" + "11" * 8, "16 bytes"),
        ("bad id:" + "11" * 32, "bad or repeated id"),
        ("k1:" + "11" * 32 + ",k1:" + "22" * 32, "bad or repeated id"),
    ],
)
def test_bad_key_material_is_refused_without_echoing_secrets(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as info:
        SigningKeys.parse(text)
    assert "11" * 8 not in str(info.value)


def test_key_material_allows_comments_and_commas() -> None:
    keys = SigningKeys.parse("# rotated 2026-12\nk2:" + "22" * 16 + ", k1:" + "11" * 16)
    assert keys.signing_id == "k2"
    assert set(keys.keys) == {"k1", "k2"}
    assert all(len(k) == 32 for k in keys.keys.values())
