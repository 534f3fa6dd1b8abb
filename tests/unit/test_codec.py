"""kvmux.codec: self-describing, checksummed entries; every corruption is CorruptEntry."""

from __future__ import annotations

import json
import struct

import pytest
import xxhash

from kvmux.codec import FORMAT_VERSION, MAGIC, LayerSpec, decode, encode, encode_parts
from kvmux.errors import CorruptEntry, KvmuxError
from kvmux.keys import namespace_id

NS = namespace_id({"m": "x"})
OTHER_NS = namespace_id({"m": "y"})
KEY = bytes(range(16))
OTHER_KEY = bytes(range(1, 17))
LAYERS = (LayerSpec((2, 3), "float32"), LayerSpec((4,), "uint8"))
PARTS = (bytes(range(100, 124)), b"\x00\x01\xfe\xff")


def _entry() -> bytes:
    return encode(NS, KEY, LAYERS, PARTS)


def _craft(header: object, payload: bytes = b"", version: int = FORMAT_VERSION) -> bytes:
    """An entry with an arbitrary header and a valid checksum."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = struct.pack("<4sHHI", MAGIC, version, 0, len(raw)) + raw + payload
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def _header(**overrides: object) -> dict[str, object]:
    header: dict[str, object] = {
        "ns": NS.hex(),
        "key": KEY.hex(),
        "layers": [[[2, 3], "float32"], [[4], "uint8"]],
        "payload_len": 28,
    }
    header.update(overrides)
    return header


def test_layer_spec_nbytes() -> None:
    assert LayerSpec((2, 3), "float32").nbytes == 24
    assert LayerSpec((2, 16, 4, 8), "bfloat16").nbytes == 2 * 16 * 4 * 8 * 2
    assert LayerSpec((7,), "float8_e4m3fn").nbytes == 7
    assert LayerSpec((), "float16").nbytes == 2
    assert LayerSpec((3, 0), "float32").nbytes == 0


def test_round_trip() -> None:
    entry = decode(_entry(), NS, KEY)
    assert entry.layers == LAYERS
    assert bytes(entry.payload) == b"".join(PARTS)
    assert entry.layer_offsets() == [0, 24]
    offsets = entry.layer_offsets()
    for layer, offset, part in zip(entry.layers, offsets, PARTS, strict=True):
        assert bytes(entry.payload[offset : offset + layer.nbytes]) == part


def test_round_trip_accepts_memoryview_parts_and_input() -> None:
    data = encode(NS, KEY, LAYERS, [memoryview(p) for p in PARTS])
    assert data == _entry()
    entry = decode(memoryview(data), NS, KEY)
    assert bytes(entry.payload) == b"".join(PARTS)
    entry = decode(bytearray(data), NS, KEY)
    assert entry.layers == LAYERS


def test_encode_parts_are_the_entry_and_share_the_layers_bytes() -> None:
    layer = bytearray(PARTS[0])
    pieces = encode_parts(NS, KEY, LAYERS, [memoryview(layer), PARTS[1]])
    assert b"".join(pieces) == _entry()
    assert any(isinstance(p, memoryview) and p.obj is layer for p in pieces)  # never copied


def test_round_trip_of_many_layers_and_dtypes() -> None:
    layers = [
        LayerSpec((2, 4, 8), dtype)
        for dtype in ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8")
    ]
    parts = [bytes([i]) * layer.nbytes for i, layer in enumerate(layers)]
    entry = decode(encode(NS, KEY, layers, parts), NS, KEY)
    assert entry.layers == tuple(layers)
    assert bytes(entry.payload) == b"".join(parts)


def test_round_trip_of_an_empty_entry() -> None:
    entry = decode(encode(NS, KEY, [], []), NS, KEY)
    assert entry.layers == ()
    assert bytes(entry.payload) == b""


def test_encode_is_deterministic() -> None:
    assert _entry() == _entry()


def test_entry_layout() -> None:
    data = _entry()
    magic, version, flags, header_len = struct.unpack_from("<4sHHI", data)
    assert (magic, version, flags) == (MAGIC, FORMAT_VERSION, 0)
    header = json.loads(data[12 : 12 + header_len])
    assert header["ns"] == NS.hex()
    assert header["key"] == KEY.hex()
    assert header["payload_len"] == 28
    assert len(data) == 12 + header_len + 28 + 8
    (digest,) = struct.unpack_from("<Q", data, len(data) - 8)
    assert digest == xxhash.xxh3_64_intdigest(data[:-8])


def test_every_single_byte_flip_is_detected() -> None:
    data = _entry()
    assert len(data) < 400  # small enough to try every position
    for position in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[position] ^= mask
            with pytest.raises(CorruptEntry):
                decode(bytes(corrupt), NS, KEY)


def test_every_truncation_is_detected() -> None:
    data = _entry()
    for length in range(len(data)):
        with pytest.raises(CorruptEntry):
            decode(data[:length], NS, KEY)


def test_appended_bytes_are_detected() -> None:
    data = _entry()
    for extra in (b"\x00", b"\x00" * 8, data[-8:]):
        with pytest.raises(CorruptEntry):
            decode(data + extra, NS, KEY)


def test_wrong_namespace() -> None:
    with pytest.raises(CorruptEntry, match="namespace"):
        decode(_entry(), OTHER_NS, KEY)


def test_wrong_key() -> None:
    with pytest.raises(CorruptEntry, match="key"):
        decode(_entry(), NS, OTHER_KEY)


def test_bad_magic() -> None:
    data = b"XXXX" + _entry()[4:]
    with pytest.raises(CorruptEntry, match="magic"):
        decode(data, NS, KEY)


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, 0xFFFF])
def test_unsupported_version(version: int) -> None:
    data = bytearray(_entry())
    struct.pack_into("<H", data, 4, version)
    with pytest.raises(CorruptEntry, match="version"):
        decode(bytes(data), NS, KEY)
    # even with a checksum that matches, the version is refused
    with pytest.raises(CorruptEntry, match="version"):
        decode(_craft(_header(), b"\x00" * 28, version=version), NS, KEY)


def test_header_length_out_of_range() -> None:
    data = bytearray(_entry())
    struct.pack_into("<I", data, 8, 0xFFFFFFFF)
    with pytest.raises(CorruptEntry, match="header length"):
        decode(bytes(data), NS, KEY)


def test_corrupt_entry_is_a_kvmux_error() -> None:
    with pytest.raises(KvmuxError):
        decode(b"", NS, KEY)


@pytest.mark.parametrize(
    "header",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"null",
        json.dumps({"ns": NS.hex(), "key": KEY.hex()}).encode(),
        _header(layers=[[[2, 3], "float64"], [[4], "uint8"]]),
        _header(layers=[[[-2, -3], "float32"], [[4], "uint8"]]),
        _header(layers=[[[2, "x"], "float32"], [[4], "uint8"]]),
        _header(layers=[[[2, 3], "float32", 1]]),
        _header(layers=[7]),
        _header(layers=None),
        _header(payload_len=27),
        _header(payload_len="many"),
        _header(ns=None),
        _header(key=5),
    ],
)
def test_malformed_headers_with_valid_checksums(header: object) -> None:
    with pytest.raises(CorruptEntry):
        decode(_craft(header, b"\x00" * 28), NS, KEY)


def test_payload_length_must_match_header() -> None:
    with pytest.raises(CorruptEntry, match="payload length"):
        decode(_craft(_header(), b"\x00" * 27), NS, KEY)
    with pytest.raises(CorruptEntry, match="payload length"):
        decode(_craft(_header(), b"\x00" * 29), NS, KEY)


def test_crafted_header_with_valid_checksum_decodes() -> None:
    # guard for the helper above: a well-formed crafted entry is accepted
    entry = decode(_craft(_header(), b"\x01" * 28), NS, KEY)
    assert entry.layers == LAYERS


@pytest.mark.parametrize(
    "header",
    [_header(payload_len=float("inf")), _header(layers=[[[float("inf")], "float32"]])],
    ids=["payload_len", "shape"],
)
def test_infinite_numbers_in_header_are_corrupt_entries(header: object) -> None:
    with pytest.raises(CorruptEntry):
        decode(_craft(header, b""), NS, KEY)


def test_encode_rejects_mismatched_payload_length() -> None:
    with pytest.raises(ValueError, match="payload length"):
        encode(NS, KEY, LAYERS, [PARTS[0]])
    with pytest.raises(ValueError, match="payload length"):
        encode(NS, KEY, LAYERS, [PARTS[0], PARTS[1] + b"\x00"])
    with pytest.raises(ValueError, match="payload length"):
        encode(NS, KEY, [], [b"\x00"])


def test_encode_rejects_unsupported_dtype() -> None:
    with pytest.raises(ValueError, match="dtype"):
        encode(NS, KEY, [LayerSpec((1,), "float64")], [b"\x00" * 8])


def test_deeply_nested_header_is_a_corrupt_entry() -> None:
    depth = 100_000
    header = b'{"ns":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(CorruptEntry):
        decode(_craft(header), NS, KEY)
