"""Fuzzing what the Redis store parses: garbage under its keys is a miss, never a crash or a stall.

The manifest format is spelled out here, apart from the code, so that these tests pin
what is on the server. Bulk fuzzing runs against the pure ``parse_manifest``; a smaller
number of planted values goes through a real redis-server, the store and back.
"""

from __future__ import annotations

import logging
import random
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

from kvmux.config import RedisSpec
from kvmux.stores.redis import RedisStore
from tests.support.mutate import mutate, random_bytes
from tests.support.redis_server import RedisServer

PREFIX = b"\x00kvmux-parts-v1\x00"
BODY = struct.Struct("<IQ16s")  # part count, total length, write nonce
SIZE = len(PREFIX) + BODY.size
MAX_ENTRY_SIZE = 1 << 30  # as documented in kvmux.stores.split
MAX_PARTS = 4096
LIMITS = (1, 3, 64, 1000, 64 * 2**20)
PURE_INPUTS = 40_000
PLANTED = 2_000
LIMIT = 64  # max_value_size of the stores below: a few hundred bytes make several parts


def _ceil(total: int, limit: int) -> int:
    return -(-total // limit)


def _pack(count: int, total: int, nonce: bytes = bytes(16)) -> bytes:
    return PREFIX + BODY.pack(count, total, nonce)


def _expected(value: bytes, limit: int) -> tuple[int, int, bytes] | None:
    """(count, total, nonce) if ``value`` is a manifest a store with this limit writes."""
    if len(value) != SIZE or not value.startswith(PREFIX):
        return None
    count, total, nonce = BODY.unpack(value[len(PREFIX) :])
    if not 1 <= total <= MAX_ENTRY_SIZE or not 1 <= count <= MAX_PARTS:
        return None
    return (count, total, nonce) if count == _ceil(total, limit) else None


# -- the pure parser -------------------------------------------------------------------


def _extreme_fields(rng: random.Random, limit: int) -> bytes:
    edges = (0, 1, limit - 1, limit, limit + 1, 2 * limit, MAX_PARTS * limit, MAX_PARTS * limit + 1)
    huge = (MAX_ENTRY_SIZE, MAX_ENTRY_SIZE + 1, 2**64 - 1, rng.randrange(2**64))
    total = rng.choice((*edges, *huge))
    total = min(max(total, 0), 2**64 - 1)
    right = _ceil(total, limit)
    count = rng.choice(
        (right, right - 1, right + 1, 0, 1, MAX_PARTS, MAX_PARTS + 1, 3_000_000, 2**32 - 1)
    )
    return _pack(min(max(count, 0), 2**32 - 1), total, rng.randbytes(16))


def _valid(rng: random.Random, limit: int) -> bytes:
    total = rng.randrange(1, min(MAX_ENTRY_SIZE, MAX_PARTS * limit) + 1)
    return _pack(_ceil(total, limit), total, rng.randbytes(16))


def _manifest_inputs(rng: random.Random) -> Iterator[tuple[bytes, int]]:
    for n in range(PURE_INPUTS):
        limit = rng.choice(LIMITS)
        kind = n % 5
        if kind == 0:
            value = _valid(rng, limit)
        elif kind == 1:
            value = _extreme_fields(rng, limit)
        elif kind == 2:
            value = mutate(rng, _valid(rng, limit))
        elif kind == 3:
            value = PREFIX + random_bytes(rng, 2 * BODY.size)
        else:
            value = random_bytes(rng, 2 * SIZE)
        yield value, limit


def test_parse_manifest_accepts_exactly_what_a_store_writes() -> None:
    from kvmux.stores.split import parse_manifest

    rng = random.Random(20240611)
    accepted = 0
    for value, limit in _manifest_inputs(rng):
        manifest = parse_manifest(value, limit)
        expected = _expected(value, limit)
        if expected is None:
            assert manifest is None, (value.hex(), limit)
            continue
        accepted += 1
        assert manifest is not None and (manifest.count, manifest.total, manifest.nonce) == expected
        assert manifest.pack() == value
        sizes = manifest.part_sizes(limit)
        assert len(sizes) == manifest.count and sum(sizes) == manifest.total
        assert all(1 <= size <= limit for size in sizes)
    assert PURE_INPUTS // 10 < accepted < PURE_INPUTS // 2


def test_parse_manifest_bounds() -> None:
    from kvmux.stores.split import Manifest, parse_manifest

    assert parse_manifest(_pack(MAX_PARTS, MAX_PARTS * 3), 3) == Manifest(
        MAX_PARTS, MAX_PARTS * 3, bytes(16)
    )
    assert parse_manifest(_pack(MAX_PARTS + 1, MAX_PARTS * 3 + 1), 3) is None
    assert parse_manifest(_pack(16, MAX_ENTRY_SIZE), MAX_ENTRY_SIZE // 16) is not None
    assert parse_manifest(_pack(17, MAX_ENTRY_SIZE + 1), MAX_ENTRY_SIZE // 16) is None
    assert parse_manifest(_pack(0, 0), 3) is None
    assert parse_manifest(_pack(1, 2), 3) is not None  # consistent, if never written
    for length in range(SIZE):
        assert parse_manifest(_pack(2, 5)[:length], 3) is None
    assert parse_manifest(_pack(2, 5) + b"\x00", 3) is None
    assert parse_manifest(_pack(2, 5), 0) is None


# -- through a real server -------------------------------------------------------------


def _store(url: str, limit: int = LIMIT) -> RedisStore:
    return RedisStore(
        RedisSpec(url=url, key_prefix=f"fz-{uuid.uuid4().hex}:", max_value_size=limit)
    )


def _name(store: RedisStore, key: bytes) -> str:
    return f"{store.spec.key_prefix}{{{key.hex()}}}"


def _part(name: str, nonce: bytes, index: int) -> str:
    return f"{name}:{nonce.hex()}:{index}"


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


WRONG_TYPE = object()  # planted as a list, not a string


@dataclass
class Planted:
    """What a test wrote under one entry key: its main value and any part values."""

    main: bytes | object
    parts: dict[str, bytes | object] = field(default_factory=dict)

    def expected(self, name: str, limit: int) -> bytes | None:
        """What ``get`` must return: the plain value, the joined parts, or a miss."""
        if not isinstance(self.main, bytes):
            return None
        if not self.main.startswith(PREFIX):
            return self.main
        manifest = _expected(self.main, limit)
        if manifest is None:
            return None
        count, total, nonce = manifest
        parts = [self.parts.get(_part(name, nonce, n)) for n in range(1, count + 1)]
        sizes = [limit] * (count - 1) + [total - (count - 1) * limit]
        if any(not isinstance(p, bytes) or len(p) != s for p, s in zip(parts, sizes, strict=True)):
            return None
        return b"".join(p for p in parts if isinstance(p, bytes))


def _split_entry(rng: random.Random, name: str) -> tuple[bytes, dict[str, bytes | object]]:
    """A valid manifest for a random value, and its parts."""
    value = rng.randbytes(rng.randrange(LIMIT + 1, 20 * LIMIT))
    nonce = rng.randbytes(16)
    parts: dict[str, bytes | object] = {
        _part(name, nonce, n + 1): value[i : i + LIMIT]
        for n, i in enumerate(range(0, len(value), LIMIT))
    }
    return _pack(len(parts), len(value), nonce), parts


def _mutate_parts(rng: random.Random, parts: dict[str, bytes | object]) -> None:
    name = rng.choice(list(parts))
    part = parts[name]
    assert isinstance(part, bytes)
    choice = rng.randrange(4)
    if choice == 0:
        del parts[name]
    elif choice == 1:
        parts[name] = WRONG_TYPE
    elif choice == 2:
        parts[name] = mutate(rng, part)
    else:  # one part a byte longer, another a byte shorter: the same total length
        other = rng.choice(list(parts))
        other_part = parts[other]
        if other != name and isinstance(other_part, bytes):
            parts[name], parts[other] = part + b"\x00", other_part[:-1]


def _planted(rng: random.Random, name: str, n: int) -> Planted:
    manifest, parts = _split_entry(rng, name)
    kind = n % 8
    if kind == 0:
        return Planted(manifest[: rng.randrange(SIZE)], parts)
    if kind == 1:
        return Planted(mutate(rng, manifest), parts)
    if kind == 2:
        return Planted(_extreme_fields(rng, LIMIT))
    if kind == 3:
        _mutate_parts(rng, parts)
        return Planted(manifest, parts)
    if kind == 4:
        return Planted(PREFIX + random_bytes(rng, 2 * BODY.size), parts)
    if kind == 5:
        return Planted(random_bytes(rng, 3 * LIMIT))
    if kind == 6:
        return Planted(WRONG_TYPE)
    return Planted(manifest, parts)  # intact: must read back whole


def _plant(client: redis.Redis, name: str, planted: Planted) -> None:
    pipe = client.pipeline(transaction=False)
    for key, value in [(name, planted.main), *planted.parts.items()]:
        pipe.delete(key)
        if isinstance(value, bytes):
            pipe.set(key, value)
        else:
            pipe.rpush(key, b"not a string")
    pipe.execute()


def test_planted_garbage_reads_as_a_miss_or_what_is_there(redis_server: RedisServer) -> None:
    rng = random.Random(20240612)
    store = _store(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    good = rng.randbytes(5 * LIMIT)
    assert store.put(_key(0), good)
    planted = {}
    for n in range(1, PLANTED + 1):
        planted[_key(n)] = _planted(rng, _name(store, _key(n)), n)
        _plant(client, _name(store, _key(n)), planted[_key(n)])
    keys, hits = list(planted), 0
    for start in range(0, len(keys), 250):
        batch = [_key(0), *keys[start : start + 250]]
        values = store.get_many(batch)
        assert values[0] == good
        for key, value in zip(batch[1:], values[1:], strict=True):
            assert value == planted[key].expected(_name(store, key), LIMIT), key.hex()
            hits += value is not None
    assert PLANTED // 4 < hits < PLANTED // 2  # intact entries and plain values read back
    for key in keys:
        store.delete(key)
        assert client.exists(_name(store, key)) == 0
        assert store.get(key) is None
    assert store.get(_key(0)) == good
    store.clear()  # parts of malformed manifests too: later tests scan the same server
    store.close()
    client.close()


# -- the bugs, one by one -------------------------------------------------------------


@pytest.fixture
def planting(redis_server: RedisServer) -> Iterator[tuple[RedisStore, redis.Redis]]:
    store = _store(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    yield store, client
    store.clear()
    store.close()
    client.close()


def test_truncated_manifest_is_a_miss_for_its_key_only(
    planting: tuple[RedisStore, redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    store, client = planting
    value = bytes(range(200))
    assert store.put(_key(1), value)
    client.set(_name(store, _key(2)), _pack(4, 200)[:-3])
    with caplog.at_level(logging.WARNING, logger="kvmux.stores.redis"):
        assert store.get_many([_key(1), _key(2)]) == [value, None]
        assert store.get(_key(2)) is None
    assert [r.message for r in caplog.records].count(
        f"kvmux redis redis: found a malformed manifest under {store.spec.key_prefix!r}; "
        "treated as a miss"
    ) == 1


@pytest.mark.parametrize("count, total", [(1_000_000, 1_000_000 * LIMIT), (1_000_000, 100)])
def test_huge_part_count_is_an_immediate_miss(
    planting: tuple[RedisStore, redis.Redis], count: int, total: int
) -> None:
    store, client = planting
    client.set(_name(store, _key(1)), _pack(count, total))
    assert store.get(_key(1)) is None
    store.delete(_key(1))
    assert client.exists(_name(store, _key(1))) == 0


def test_empty_manifest_is_a_miss_for_its_key_only(
    planting: tuple[RedisStore, redis.Redis],
) -> None:
    store, client = planting
    assert store.put(_key(1), b"fine")
    client.set(_name(store, _key(2)), _pack(0, 0))
    assert store.get_many([_key(1), _key(2)]) == [b"fine", None]


def test_key_of_another_type_is_a_miss_for_its_key_only(
    planting: tuple[RedisStore, redis.Redis],
) -> None:
    store, client = planting
    assert store.put(_key(1), b"fine")
    client.rpush(_name(store, _key(2)), b"a list")
    assert store.get_many([_key(1), _key(2)]) == [b"fine", None]
    store.delete(_key(2))
    assert client.exists(_name(store, _key(2))) == 0


@pytest.mark.parametrize("length", [len(PREFIX), SIZE - 1, SIZE + 1])
def test_delete_of_a_malformed_manifest_removes_the_key(
    planting: tuple[RedisStore, redis.Redis], length: int
) -> None:
    store, client = planting
    client.set(_name(store, _key(1)), (_pack(2, 100) + b"\x00")[:length])
    store.delete(_key(1))
    assert client.exists(_name(store, _key(1))) == 0


def test_parts_of_swapped_lengths_are_a_miss(planting: tuple[RedisStore, redis.Redis]) -> None:
    store, client = planting
    value = bytes(range(256)) * 2
    assert store.put(_key(1), value)
    names = sorted(client.scan_iter(match=f"{store.spec.key_prefix}*:*", count=1000))
    first, second = (client.get(n) for n in names[:2])
    assert isinstance(first, bytes) and isinstance(second, bytes)
    client.set(names[0], first + b"\x00")  # the same total length, shifted content
    client.set(names[1], second[:-1])
    assert store.get(_key(1)) is None


def test_entry_of_too_many_parts_is_refused(planting: tuple[RedisStore, redis.Redis]) -> None:
    store, _ = planting
    small = _store(store.spec.url, limit=1)
    assert small.put_many([(_key(1), bytes(MAX_PARTS)), (_key(2), bytes(MAX_PARTS + 1))]) == [
        True,
        False,
    ]
    assert small.get(_key(1)) == bytes(MAX_PARTS)
    assert small.get(_key(2)) is None
    small.clear()
    small.close()
