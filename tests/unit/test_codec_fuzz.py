"""Fuzzing codec.decode: whatever the bytes, a correct entry or CorruptEntry, never an escape.

Seeded, so every run tries the same inputs. Byte mutations of valid entries exercise the
framing and the checksum; mutations of the JSON header with a recomputed checksum reach
the header parser, which a byte mutation alone almost never does.
"""

from __future__ import annotations

import array
import copy
import json
import random
import struct
import sys
from collections.abc import Iterator

import pytest
import xxhash

from kvmux.codec import FORMAT_VERSION, MAGIC, DecodedEntry, LayerSpec, decode, encode
from kvmux.errors import CorruptEntry
from kvmux.keys import namespace_id
from tests.support.mutate import mutate, random_bytes

NS = namespace_id({"m": "fuzz"})
KEY = bytes(range(16))
DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "uint8", "int8")
BYTE_MUTATIONS = 40_000
HEADER_MUTATIONS = 25_000
RANDOM_INPUTS = 15_000


def _seed_entries() -> list[bytes]:
    specs = [
        [LayerSpec((2, 3), "float32"), LayerSpec((4,), "uint8")],
        [],
        [LayerSpec((2, 0, 5), "bfloat16"), LayerSpec((), "float16")],
        [LayerSpec((2, 4, 2, 1), dtype) for dtype in DTYPES],
    ]
    rng = random.Random(1)
    return [
        encode(NS, KEY, layers, [rng.randbytes(layer.nbytes) for layer in layers])
        for layers in specs
    ]


SEEDS = _seed_entries()


def _decode(data: bytes) -> DecodedEntry | None:
    """The entry, or None for CorruptEntry; any other exception fails the test."""
    try:
        return decode(data, NS, KEY)
    except CorruptEntry:
        return None


def _craft(header: bytes, payload: bytes) -> bytes:
    """An entry with this exact header text and a valid checksum."""
    body = struct.pack("<4sHHI", MAGIC, FORMAT_VERSION, 0, len(header)) + header + payload
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def _split(entry: bytes) -> tuple[bytes, bytes]:
    """(header text, payload) of a valid entry."""
    (header_len,) = struct.unpack_from("<I", entry, 8)
    return entry[12 : 12 + header_len], entry[12 + header_len : -8]


def _assert_consistent(data: bytes, entry: DecodedEntry) -> None:
    """An accepted entry says exactly what its header says, and re-encodes to the same."""
    header_text, payload = _split(data)
    header = json.loads(header_text)
    assert header["ns"] == NS.hex() and header["key"] == KEY.hex()
    assert header["layers"] == [[list(layer.shape), layer.dtype] for layer in entry.layers]
    assert header["payload_len"] == len(payload) == sum(layer.nbytes for layer in entry.layers)
    assert bytes(entry.payload) == payload
    for layer in entry.layers:
        assert layer.dtype in DTYPES
        assert all(type(d) is int and 0 <= d < 2**63 for d in layer.shape)
    again = decode(encode(NS, KEY, entry.layers, [entry.payload]), NS, KEY)
    assert again.layers == entry.layers and bytes(again.payload) == payload


def test_seeds_decode() -> None:
    for seed in SEEDS:
        entry = decode(seed, NS, KEY)
        _assert_consistent(seed, entry)


def test_byte_mutations_are_corrupt_or_unchanged() -> None:
    rng = random.Random(20240601)
    accepted = 0
    for _ in range(BYTE_MUTATIONS):
        seed = rng.choice(SEEDS)
        data = mutate(rng, seed)
        entry = _decode(data)
        if entry is not None:  # only a mutation that changed nothing may be accepted
            assert data == seed
            accepted += 1
    assert accepted < BYTE_MUTATIONS // 100


# -- header mutations under a valid checksum ------------------------------------------

_RAW = "@raw@"  # a string value replaced by raw JSON text after json.dumps
_RAW_TEXTS = (
    "9" * 5000,  # over Python's default limit on int digits
    "9" * 21,
    "18446744073709551616",  # 2**64
    "-1",
    "-0",
    "1.0",
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    "true",
    "null",
    '"\\ud800"',
    "[" * 2000 + "]" * 2000,
    '{"a":' * 500 + "1" + "}" * 500,
)
_VALUES: tuple[object, ...] = (
    0,
    1,
    -1,
    2**31,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    10**19,
    True,
    False,
    None,
    1.5,
    "",
    "float32",
    "28",
    [],
    [1],
    [[]],
    {},
    {"a": 1},
    [[2, 3], "float32"],
    [2**62, 2**62],
    [2**62] * 32,
    [1] * 33,
    NS.hex(),
    KEY.hex(),
)


def _value(rng: random.Random) -> object:
    if rng.random() < 0.3:
        return f"{_RAW}{rng.randrange(len(_RAW_TEXTS))}"
    return copy.deepcopy(rng.choice(_VALUES))


def _render(header: object) -> bytes:
    text = json.dumps(header, separators=(",", ":"))
    for index, raw in enumerate(_RAW_TEXTS):
        text = text.replace(f'"{_RAW}{index}"', raw)
    return text.encode()


def _mutate_header(rng: random.Random, header: dict[str, object]) -> object:
    """The header with one field, layer, shape, dimension or dtype replaced or dropped."""
    layers = header["layers"]
    assert isinstance(layers, list)
    choice = rng.randrange(7)
    if choice == 0:
        header[rng.choice(("ns", "key", "layers", "payload_len", "extra"))] = _value(rng)
    elif choice == 1:
        del header[rng.choice(("ns", "key", "layers", "payload_len"))]
    elif choice == 2 and layers:
        layers[rng.randrange(len(layers))] = _value(rng)
    elif choice == 3 and layers:
        layer = layers[rng.randrange(len(layers))]
        layer[rng.randrange(2)] = _value(rng)
    elif choice == 4 and layers and layers[0][0]:
        shape = layers[0][0]
        shape[rng.randrange(len(shape))] = _value(rng)
    elif choice == 5:
        assert isinstance(header["payload_len"], int)
        header["payload_len"] += rng.choice((-1, 1, 2**64, -(2**64)))
    else:
        return rng.choice((layers, [header], header["payload_len"], None, "x", _value(rng)))
    return header


def _header_mutations(rng: random.Random) -> Iterator[bytes]:
    for n in range(HEADER_MUTATIONS):
        seed = rng.choice(SEEDS)
        text, payload = _split(seed)
        # alternately the bytes of the JSON text and the values in its structure
        new_text = mutate(rng, text) if n % 2 else _render(_mutate_header(rng, json.loads(text)))
        if rng.random() < 0.1:
            payload = mutate(rng, payload) if payload else rng.randbytes(4)
        yield _craft(new_text, payload)


def test_header_mutations_with_valid_checksums_are_corrupt_or_consistent() -> None:
    rng = random.Random(20240602)
    outcomes = {"accepted": 0, "corrupt": 0}
    for data in _header_mutations(rng):
        entry = _decode(data)
        if entry is None:
            outcomes["corrupt"] += 1
        else:
            _assert_consistent(data, entry)
            outcomes["accepted"] += 1
    assert outcomes["corrupt"] > HEADER_MUTATIONS // 2  # the mutations do reach the parser


@pytest.mark.parametrize("raw", _RAW_TEXTS, ids=[f"raw{i}" for i in range(len(_RAW_TEXTS))])
@pytest.mark.parametrize(
    "place", ["payload_len", "layers", "layer", "shape", "dim", "dtype", "ns", "top"]
)
def test_odd_json_anywhere_in_the_header_is_corrupt(raw: str, place: str) -> None:
    token = f'"{_RAW}{_RAW_TEXTS.index(raw)}"'
    header = {
        "ns": NS.hex(),
        "key": KEY.hex(),
        "layers": [[[2, 3], "float32"]],
        "payload_len": 24,
    }
    pointers: dict[str, tuple[object, object]] = {
        "payload_len": (header, "payload_len"),
        "layers": (header, "layers"),
        "layer": (header["layers"], 0),
        "shape": (header["layers"][0], 0),  # type: ignore[index]
        "dim": (header["layers"][0][0], 1),  # type: ignore[index]
        "dtype": (header["layers"][0], 1),  # type: ignore[index]
        "ns": (header, "ns"),
    }
    if place == "top":
        text = raw.encode()
    else:
        container, index = pointers[place]
        container[index] = token.strip('"')  # type: ignore[index]
        text = _render(header)
    assert _decode(_craft(text, bytes(24))) is None


# -- random bytes --------------------------------------------------------------------


def _random_inputs(rng: random.Random) -> Iterator[bytes]:
    prefix = struct.pack("<4sHH", MAGIC, FORMAT_VERSION, 0)
    for n in range(RANDOM_INPUTS):
        data = random_bytes(rng, 256)
        if n % 3 == 1:  # past the magic and version checks
            data = prefix + struct.pack("<I", rng.randrange(len(data) + 1)) + data
        elif n % 3 == 2:  # past the checksum too
            data = _craft(data, rng.randbytes(rng.randrange(32)))
        yield data


def test_random_bytes_are_corrupt() -> None:
    rng = random.Random(20240603)
    for data in _random_inputs(rng):
        assert _decode(data) is None


# -- cost and odd buffers --------------------------------------------------------------


def _big_headers() -> dict[str, bytes]:
    start = f'{{"ns":"{NS.hex()}","key":"{KEY.hex()}",'
    huge = "9" * 4300  # the most digits Python parses by default
    room = (1 << 20) - 200
    many_dims = "[[" + ",".join([huge] * (room // 4301)) + '],"uint8"]'
    layer = "[[" + ",".join(["4611686018427387904"] * 32) + '],"float32"]'
    many_layers = ",".join([layer] * (room // (len(layer) + 1)))
    return {
        "huge-dims": f'{start}"layers":[{many_dims}],"payload_len":0}}'.encode(),
        "huge-products": f'{start}"layers":[{many_layers}],"payload_len":0}}'.encode(),
        "huge-int": f'{start}"layers":[],"payload_len":{"9" * room}}}'.encode(),
        "deep": f'{start}"layers":{"[" * (room // 2)}{"]" * (room // 2)}}}'.encode(),
    }


@pytest.mark.parametrize("unlimited_ints", [False, True], ids=["default", "no-digit-limit"])
@pytest.mark.parametrize("name", list(_big_headers()))
def test_oversized_header_values_are_misses(name: str, unlimited_ints: bool) -> None:
    """Huge integers, products and nesting are refused as such, never evaluated."""
    data = _craft(_big_headers()[name], b"")
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0 if unlimited_ints else limit)
    try:
        assert _decode(data) is None
    finally:
        sys.set_int_max_str_digits(limit)


def _entry_of_whole_words() -> bytes:
    """A valid entry whose length is a multiple of 8 bytes."""
    for n in range(8):
        data = encode(NS, KEY, [LayerSpec((n,), "uint8")], [bytes(range(n))])
        if len(data) % 8 == 0:
            return data
    raise AssertionError("no length is a multiple of 8")


def test_any_contiguous_buffer_is_read_as_its_bytes() -> None:
    data = _entry_of_whole_words()
    words = array.array("Q", data)  # the same bytes, seen as 8-byte items
    grid = memoryview(data).cast("B", (len(data) // 8, 8))
    for buffer in (data, bytearray(data), memoryview(data), memoryview(words), grid):
        entry = decode(buffer, NS, KEY)
        assert bytes(entry.payload) == _split(data)[1]


@pytest.mark.parametrize("odd", [None, "text", 42, [1, 2]], ids=repr)
def test_what_is_not_a_byte_buffer_is_corrupt(odd: object) -> None:
    assert _decode(odd) is None  # type: ignore[arg-type]


def test_a_strided_buffer_is_corrupt() -> None:
    assert _decode(memoryview(SEEDS[0] * 2)[::2]) is None  # type: ignore[arg-type]
