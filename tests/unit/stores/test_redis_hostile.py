"""Hostile writers of the Redis keyspace: whatever they plant under the tier's prefix, a read
is a miss for that key alone, and takes bounded memory and time.

For each object the tier reads (an entry's value, a split entry's manifest, each of its
parts, the generation key), every planted kind (another type, empty, truncated, garbage,
one byte longer, just over the store's ``value_limit``, 64 MiB, manifest numbers out of
range) is read in a batch between two good entries, over a standalone server and a
cluster of redis-server and of valkey-server. A read is a miss when the store returns
None (for the generation too: a key of another type is no record),
or returns bytes the codec refuses: the store cannot tell garbage of an entry's length
from an entry, the checksum does. The manifest format is spelled out here, as in
``test_redis_fuzz``, to pin what is on the server.
"""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redis.cluster

from kvmux.codec import LayerSpec, decode, encode
from kvmux.config import RedisSpec
from kvmux.errors import CorruptEntry
from kvmux.stores.base import GENERATION_RECORD_MAX
from kvmux.stores.redis import RedisStore
from kvmux.stores.split import parse_manifest
from kvmux.tier.scheduler.generation import decode_record, encode_record, new_generation

PREFIX = b"\x00kvmux-parts-v1\x00"
BODY = struct.Struct("<IQ16s")  # part count, total length, write nonce
MANIFEST_SIZE = len(PREFIX) + BODY.size
MAX_ENTRY_SIZE = 1 << 30  # as documented in kvmux.stores.split
MAX_PARTS = 4096

LIMIT = 1 << 20  # every store's value_limit here
PART = 256 << 10  # every store's max_value_size: SPLIT bytes make three parts
PLAIN = 100 << 10  # an entry stored whole
SPLIT = 700 << 10  # an entry stored as a manifest and three parts
HUGE = 64 << 20  # a planted value far over the limit (built on the server, never sent)
PEAK = 4 * LIMIT  # most bytes one hostile read may allocate (a reply of LIMIT + 1 costs ~3x)
SLOW = 10.0  # seconds: far more than a bounded read takes, far less than a stall
NAMESPACE = b"hostile-test"

SERVERS = ["redis", "redis-cluster", "valkey", "valkey-cluster"]
WRONG_TYPES = ["list", "hash", "set", "zset", "stream"]
BYTE_KINDS = ["empty", "truncated", "garbage", "longer", "over-limit", "huge"]
KINDS = WRONG_TYPES + BYTE_KINDS


def _ceil(total: int, limit: int) -> int:
    return -(-total // limit)


def _pack(count: int, total: int, nonce: bytes = bytes(16)) -> bytes:
    return PREFIX + BODY.pack(count, total, nonce)


RIGHT = _ceil(SPLIT, PART)
MANIFEST_NUMBERS = {  # (part count, total length) planted with the good entry's nonce
    "zero": (0, 0),
    "no-parts": (0, SPLIT),
    "no-total": (RIGHT, 0),
    "a-part-short": (RIGHT - 1, SPLIT),
    "a-part-more": (RIGHT + 1, SPLIT),
    "count-u32-max": (2**32 - 1, SPLIT),
    "total-u64-max": (RIGHT, 2**64 - 1),
    "both-max": (2**32 - 1, 2**64 - 1),
    "total-2-63": (1, 2**63),
    "parts-over-max": (MAX_PARTS + 1, (MAX_PARTS + 1) * PART),
    "max-entry-over-limit": (MAX_PARTS, MAX_PARTS * PART),  # consistent, 1 GiB
    "entry-over-max": (_ceil(MAX_ENTRY_SIZE + 1, PART), MAX_ENTRY_SIZE + 1),
    "over-limit-total": (_ceil(LIMIT + 1, PART), LIMIT + 1),  # consistent, a byte too long
}
MANIFEST_KINDS = [*KINDS, "prefix-garbage", "ascii-numbers", *MANIFEST_NUMBERS]


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _name(store: RedisStore, key: bytes) -> str:
    """The Redis key of entry ``key``."""
    return f"{store.spec.key_prefix}{{{key.hex()}}}"


def _entry(key: bytes, nbytes: int) -> bytes:
    """A codec entry of about ``nbytes`` for ``key``: only this one decodes there."""
    payload = random.Random(key).randbytes(nbytes)
    return encode(NAMESPACE, key, [LayerSpec((nbytes,), "uint8")], [payload])


def _is_miss(value: bytes | None, key: bytes) -> bool:
    """Whether the tier serves nothing from ``value`` (absent, or refused by the codec)."""
    if value is None:
        return True
    try:
        decode(value, NAMESPACE, key)
    except CorruptEntry:
        return True
    return False


@dataclass
class Tier:
    """A store limited to LIMIT, a plain client to plant with, and two good entries."""

    store: RedisStore
    client: Any  # redis.Redis or redis.cluster.RedisCluster
    good: dict[bytes, bytes]

    def name(self, key: bytes) -> str:
        """The Redis key of entry ``key``."""
        return _name(self.store, key)

    def part(self, key: bytes, index: int) -> str:
        """The Redis key of part ``index`` of the split entry ``key``, as written."""
        raw = self.client.get(self.name(key))
        nonce = BODY.unpack_from(raw, len(PREFIX))[2]
        return f"{self.name(key)}:{nonce.hex()}:{index}"

    @property
    def generation(self) -> str:
        """The Redis key of the generation record."""
        return f"{self.store.spec.key_prefix}generation"


def _client(url: str, cluster: bool) -> Any:
    if cluster:
        return redis.cluster.RedisCluster.from_url(url)
    return redis.Redis.from_url(url)


def _store(url: str, cluster: bool, max_value_size: int = PART) -> RedisStore:
    prefix = f"hostile-{uuid.uuid4().hex}:"  # each test sees only its own keys
    spec = RedisSpec(url=url, cluster=cluster, key_prefix=prefix, max_value_size=max_value_size)
    return RedisStore(spec)


def _url(request: pytest.FixtureRequest, server: str) -> tuple[str, bool]:
    program, _, kind = server.partition("-")
    cluster = kind == "cluster"
    fixture = f"{program}_{'cluster' if cluster else 'server'}"
    return request.getfixturevalue(fixture).url, cluster


@pytest.fixture(params=SERVERS)
def tier(request: pytest.FixtureRequest) -> Iterator[Tier]:
    url, cluster = _url(request, request.param)
    store = _store(url, cluster)
    store.limit_values(LIMIT)
    good = {_key(1): _entry(_key(1), PLAIN), _key(3): _entry(_key(3), SPLIT)}
    assert store.put_many(list(good.items())) == [True, True]
    client = _client(url, cluster)
    yield Tier(store, client, good)
    store.clear()  # the servers are shared by the whole session
    store.close()
    client.close()


# -- planting ---------------------------------------------------------------------------


def _plant_type(client: Any, name: str, kind: str) -> None:
    if kind == "list":
        client.rpush(name, b"x")
    elif kind == "hash":
        client.hset(name, "field", b"x")
    elif kind == "set":
        client.sadd(name, b"x")
    elif kind == "zset":
        client.zadd(name, {b"x": 1.0})
    else:
        assert kind == "stream"
        client.xadd(name, {"field": b"x"})


def _garbled(kind: str, original: bytes) -> bytes:
    """What a byte kind makes of ``original``."""
    rng = random.Random(f"{kind}:{len(original)}")
    if kind == "empty":
        return b""
    if kind == "truncated":
        return original[: len(original) // 2]
    if kind == "garbage":  # of the original's length
        return rng.randbytes(len(original))
    if kind == "longer":
        return original + b"\x00"
    if kind == "over-limit":
        return original + bytes(LIMIT + 1 - len(original))
    if kind == "prefix-garbage":
        return PREFIX + rng.randbytes(BODY.size)
    assert kind == "ascii-numbers"  # numbers no u32/u64 field holds, as text
    return PREFIX + b"%d:%d" % (10**30, 2**64)


def _plant(client: Any, name: str, kind: str, original: bytes) -> None:
    """Replace the key ``name`` by what ``kind`` names, made from its ``original`` value."""
    client.delete(name)
    if kind in WRONG_TYPES:
        _plant_type(client, name, kind)
    elif kind == "huge":  # the original's bytes, then zeros up to HUGE
        client.set(name, original)
        client.setrange(name, HUGE - 1, b"\xff")
    elif kind in MANIFEST_NUMBERS:
        count, total = MANIFEST_NUMBERS[kind]
        client.set(name, _pack(count, total, BODY.unpack_from(original, len(PREFIX))[2]))
    else:
        client.set(name, _garbled(kind, original))


# -- reading ----------------------------------------------------------------------------


def _bounded(read: Callable[[], object]) -> object:
    """``read()``, asserting it allocated at most PEAK bytes and took under SLOW seconds."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        result = read()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK, f"a hostile read allocated {peak} bytes"
    assert time.monotonic() - started < SLOW
    return result


def _assert_batch_misses(tier: Tier, hostile: bytes, store_none: bool) -> None:
    """Between the good entries, ``hostile`` is a miss; ``store_none``: the store says None
    (else it may return bytes of at most LIMIT, which the codec refuses)."""
    keys = [_key(1), hostile, _key(3)]
    values = tier.store.get_many(keys)
    assert values[0] == tier.good[_key(1)] and values[2] == tier.good[_key(3)]
    assert _is_miss(values[1], hostile)
    assert values[1] is None or (not store_none and len(values[1]) <= LIMIT)
    heads = tier.store.head_many(keys, 64)
    assert heads[0] == tier.good[_key(1)][:64] and heads[2] == tier.good[_key(3)][:64]
    assert heads[1] is None or len(heads[1]) <= 64


def _assert_alone_misses(tier: Tier, hostile: bytes, store_none: bool, written: bytes) -> None:
    """Read alone, every way, ``hostile`` is a miss within PEAK bytes and SLOW seconds; its
    head is what ``get`` reads, or (a part short or missing) the start of what was
    ``written``, or None."""
    store = tier.store
    value = _bounded(lambda: store.get(hostile))
    assert value is None or (not store_none and isinstance(value, bytes))
    assert _bounded(lambda: store.get_many([hostile])) == [value]
    into = _bounded(lambda: store.get_into(hostile, bytearray(64)))
    assert into is None or bytes(into) == value
    head = _bounded(lambda: store.head(hostile, 2 * LIMIT))
    assert head is None or head == value or (isinstance(head, bytes) and written.startswith(head))


def _assert_misses(tier: Tier, hostile: bytes, store_none: bool, written: bytes) -> None:
    _assert_batch_misses(tier, hostile, store_none)
    _assert_alone_misses(tier, hostile, store_none, written)
    walked = {entry.key for entry in tier.store.walk()}
    assert {_key(1), _key(3)} <= walked
    tier.store.delete(hostile)
    assert tier.client.exists(tier.name(hostile)) == 0
    assert tier.store.get(hostile) is None
    assert tier.store.get_many(list(tier.good)) == list(tier.good.values())


# -- each object the tier reads -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_entry_is_a_miss_for_its_key_only(tier: Tier, kind: str) -> None:
    hostile = _key(2)
    original = _entry(hostile, PLAIN)
    assert tier.store.put(hostile, original)
    _plant(tier.client, tier.name(hostile), kind, original)
    store_none = kind in WRONG_TYPES or kind in ("over-limit", "huge")
    _assert_misses(tier, hostile, store_none, original)


@pytest.mark.parametrize("kind", MANIFEST_KINDS)
def test_a_hostile_manifest_is_a_miss_for_its_key_only(tier: Tier, kind: str) -> None:
    hostile, written = _key(2), _entry(_key(2), SPLIT)
    assert tier.store.put(hostile, written)
    original = tier.client.get(tier.name(hostile))
    assert len(original) == MANIFEST_SIZE and original.startswith(PREFIX)
    _plant(tier.client, tier.name(hostile), kind, original)
    _assert_misses(tier, hostile, kind not in ("empty", "garbage"), written)


@pytest.mark.parametrize("kind", [*KINDS, "deleted"])
@pytest.mark.parametrize("index", range(1, RIGHT + 1))
def test_a_hostile_part_is_a_miss_for_its_key_only(tier: Tier, index: int, kind: str) -> None:
    hostile, written = _key(2), _entry(_key(2), SPLIT)
    assert tier.store.put(hostile, written)
    name = tier.part(hostile, index)
    if kind == "deleted":
        tier.client.delete(name)
    else:
        _plant(tier.client, name, kind, tier.client.get(name))
    _assert_misses(tier, hostile, kind != "garbage", written)  # garbage: the codec's miss
    assert tier.client.exists(name) == 0  # the valid manifest named it: deleted with it


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_generation_key_is_no_record(tier: Tier, kind: str) -> None:
    store, original = tier.store, encode_record(new_generation(), None)
    store.write_generation(original)
    assert store.read_generation() == original
    _plant(tier.client, tier.generation, kind, original)
    raw = _bounded(store.read_generation)  # another type: no record, so it is replaced
    assert raw is None or (isinstance(raw, bytes) and len(raw) <= GENERATION_RECORD_MAX + 1)
    assert decode_record(raw, None) is None
    assert store.get_many(list(tier.good)) == list(tier.good.values())
    store.write_generation(original)  # SET replaces a key of any type
    assert store.read_generation() == original


# -- manifests, many at once ------------------------------------------------------------


def _random_manifest(rng: random.Random, nonce: bytes) -> bytes:
    """A manifest-shaped value whose numbers are drawn from the edges of their fields."""
    totals = (0, 1, PART, PART + 1, SPLIT, LIMIT, LIMIT + 1, MAX_ENTRY_SIZE, 2**63, 2**64 - 1)
    total = rng.choice((*totals, rng.randrange(2**64)))
    right = _ceil(total, PART)
    counts = (0, 1, right - 1, right, right + 1, MAX_PARTS, MAX_PARTS + 1, 2**32 - 1)
    count = min(max(rng.choice((*counts, rng.randrange(2**32))), 0), 2**32 - 1)
    value = _pack(count, total, nonce)
    return value if rng.random() < 0.8 else value[: rng.randrange(MANIFEST_SIZE)]


@pytest.mark.parametrize("seed", range(3))
def test_random_manifests_in_one_batch_are_misses_each(tier: Tier, seed: int) -> None:
    """Manifests whose parts are absent, or over the limit: every one a miss, no part
    read beyond what a valid one of at most LIMIT bytes names."""
    rng = random.Random(seed)
    planted = [_key(100 + i) for i in range(300)]
    pipe = tier.client.pipeline(transaction=False)
    for key in planted:
        pipe.set(tier.name(key), _random_manifest(rng, rng.randbytes(16)))
    pipe.execute()
    keys = [_key(1), *planted, _key(3)]
    values = _bounded(lambda: tier.store.get_many(keys))
    assert isinstance(values, list)
    assert values[0] == tier.good[_key(1)] and values[-1] == tier.good[_key(3)]
    for key, value in zip(planted, values[1:-1], strict=True):  # a short one is plain bytes
        assert _is_miss(value, key) and (value is None or not value.startswith(PREFIX))
    heads = tier.store.head_many(keys, 64)
    assert all(head is None or not head.startswith(PREFIX) for head in heads[1:-1])


def test_parse_manifest_refuses_a_total_over_the_reader_limit() -> None:
    assert parse_manifest(_pack(4, LIMIT), PART, LIMIT) is not None
    assert parse_manifest(_pack(5, LIMIT + 1), PART, LIMIT) is None
    assert parse_manifest(_pack(5, LIMIT + 1), PART) is not None  # no limit: MAX_ENTRY_SIZE
    assert parse_manifest(_pack(1, 1), PART, 0) is None
    assert parse_manifest(_pack(MAX_PARTS, MAX_ENTRY_SIZE), MAX_ENTRY_SIZE // MAX_PARTS, 2**64)
    rng = random.Random(7)
    for _ in range(20_000):
        limit = rng.choice((0, 1, PART, LIMIT, MAX_ENTRY_SIZE))
        manifest = parse_manifest(_random_manifest(rng, bytes(16)), PART, limit)
        assert manifest is None or 1 <= manifest.total <= limit


# -- what the limit leaves alone ----------------------------------------------------------


def _server_store(request: pytest.FixtureRequest, max_value_size: int) -> RedisStore:
    url, cluster = _url(request, request.param)
    return _store(url, cluster, max_value_size)


@pytest.fixture(params=SERVERS)
def server_store(request: pytest.FixtureRequest) -> Iterator[Callable[[int], RedisStore]]:
    opened: list[RedisStore] = []

    def make(max_value_size: int) -> RedisStore:
        opened.append(_server_store(request, max_value_size))
        return opened[-1]

    yield make
    for store in opened:
        store.clear()
        store.close()


@pytest.mark.parametrize("max_value_size", [PART, 4 * LIMIT])
def test_entries_within_the_limit_read_back_and_longer_ones_are_misses(
    server_store: Callable[[int], RedisStore], max_value_size: int
) -> None:
    store = server_store(max_value_size)
    store.limit_values(LIMIT)
    sizes = [0, 1, PLAIN, SPLIT, LIMIT - 1, LIMIT, LIMIT + 1, 2 * LIMIT]
    values = [random.Random(size).randbytes(size) for size in sizes]
    items = [(_key(i), value) for i, value in enumerate(values)]
    assert store.put_many(items) == [True] * len(items)  # writes know no read limit
    expected = [value if len(value) <= LIMIT else None for value in values]
    assert store.get_many([key for key, _ in items]) == expected
    heads = store.head_many([key for key, _ in items], 100)
    assert heads == [None if value is None else value[:100] for value in expected]
    assert store.get(_key(99)) is None and store.head(_key(99), 10) is None  # absent


def test_without_a_limit_values_are_read_whole_and_manifests_still_checked(
    server_store: Callable[[int], RedisStore],
) -> None:
    plain, store = server_store(4 * LIMIT), server_store(PART)
    assert plain.value_limit is None and store.value_limit is None
    big = random.Random(1).randbytes(2 * LIMIT + 3)
    assert plain.put(_key(1), big) and plain.get(_key(1)) == big  # read whole with GET
    assert store.put(_key(2), big)  # split: nine parts, and a manifest
    client = _client(store.spec.url, store.spec.cluster)
    client.set(_name(store, _key(3)), _pack(MAX_PARTS, MAX_PARTS * PART))  # parts absent
    client.set(_name(store, _key(4)), _pack(2**32 - 1, 2**64 - 1))
    client.rpush(_name(store, _key(5)), b"a list")
    keys = [_key(3), _key(4), _key(5), _key(2)]
    assert store.get_many(keys) == [None, None, None, big]
    client.close()


class _CountingPipelines:
    """Wraps a store's ``_pipeline`` to count the pipelines it executes."""

    def __init__(self, store: RedisStore):
        self.executed = 0
        self._make = store._pipeline
        store._pipeline = self._pipeline  # type: ignore[method-assign]

    def _pipeline(self, client: Any) -> Any:
        pipe = self._make(client)
        execute = pipe.execute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.executed += 1
            return execute(*args, **kwargs)

        pipe.execute = counted
        return pipe


def test_a_bounded_batch_costs_the_round_trips_it_did(tier: Tier) -> None:
    counting = _CountingPipelines(tier.store)
    plain = [_key(1), _key(2), _key(5)]
    tier.client.rpush(tier.name(_key(2)), b"a list")
    tier.client.setrange(tier.name(_key(5)), HUGE - 1, b"\xff")
    assert tier.store.get_many(plain) == [tier.good[_key(1)], None, None]
    assert counting.executed == 1  # plain entries: one pipeline
    assert tier.store.get_many([*plain, _key(3)])[3] == tier.good[_key(3)]
    assert counting.executed == 3  # and one more for the parts of split ones
    tier.client.set(tier.name(_key(6)), _pack(MAX_PARTS, MAX_PARTS * PART))
    assert tier.store.get_many([_key(6)]) == [None] and counting.executed == 4  # no part read
    assert tier.store.head_many(plain, 10)[0] == tier.good[_key(1)][:10]
    assert counting.executed == 5
