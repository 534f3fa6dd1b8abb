"""The KVStore contract, run against every store."""

from __future__ import annotations

import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvmux.config import RedisSpec
from kvmux.stores import DictStore, DiskStore, KVStore
from kvmux.stores import disk as disk_module
from kvmux.stores.redis import RedisStore

MakeStore = Callable[[int], KVStore]


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _entry_bytes(store: KVStore) -> int:
    """Bytes of the store's entries: exact for memory, the entry files on disk."""
    if isinstance(store, DiskStore):
        return sum(p.stat().st_size for p in store.root.glob("??/*") if p.is_file())
    return store.used_bytes()


def _occupied_bytes(store: KVStore) -> int:
    """Bytes the store really occupies: exact for memory; on disk, spares count too."""
    if isinstance(store, DiskStore):
        return sum(p.stat().st_size for p in store.root.rglob("*") if p.is_file())
    return store.used_bytes()


def budgeted(store: KVStore) -> bool:
    """Whether the store enforces its own byte budget (Redis leaves it to the server)."""
    return store.capacity > 0


def _redis(url: str, cluster: bool, max_value_size: int = 64 * 2**20) -> RedisStore:
    prefix = f"kvmux-test-{uuid.uuid4().hex}:"  # each test sees only its own keys
    spec = RedisSpec(
        url=url,
        name="redis-test",
        cluster=cluster,
        key_prefix=prefix,
        max_value_size=max_value_size,
    )
    return RedisStore(spec)


SERVERS = ["redis", "valkey"]  # the Redis tier's store, on redis-server and on valkey-server
# disk-direct: every entry written around the page cache, however small
STORES = ["dict", "disk", "disk-direct"] + [
    f"{s}{v}" for s in SERVERS for v in ("", "-split", "-cluster")
]


def _server_store(request: pytest.FixtureRequest, variant: str) -> RedisStore:
    """A RedisStore on the server a variant names: "valkey", "redis-split", "valkey-cluster"."""
    server, _, kind = variant.partition("-")
    if kind == "cluster":
        return _redis(request.getfixturevalue(f"{server}_cluster").url, cluster=True)
    url = request.getfixturevalue(f"{server}_server").url
    if kind == "split":  # every entry over 3 bytes is split into parts
        return _redis(url, cluster=False, max_value_size=3)
    return _redis(url, cluster=False)


@pytest.fixture(params=STORES)
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MakeStore]:
    opened: list[KVStore] = []
    if request.param == "disk-direct":
        monkeypatch.setattr(disk_module, "DIRECT_MIN_BYTES", 0)

    def make(capacity: int) -> KVStore:
        store: KVStore
        if request.param == "dict":
            store = DictStore(capacity, name="dict-test")
        elif request.param.startswith("disk"):
            direct = request.param == "disk-direct"
            store = DiskStore(
                tmp_path / f"store{len(opened)}", capacity, name="disk-test", direct_writes=direct
            )
        else:
            store = _server_store(request, request.param)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: MakeStore) -> KVStore:
    return make_store(1 << 20)


def test_names_and_capacity(store: KVStore) -> None:
    assert store.name.endswith("-test")
    assert store.capacity == (1 << 20 if budgeted(store) else 0)


def test_empty_store(store: KVStore) -> None:
    assert store.get(_key(1)) is None
    assert not store.contains(_key(1))
    assert not budgeted(store) or store.used_bytes() == 0
    assert store.count_prefix([]) == 0
    assert store.count_prefix([_key(1)]) == 0
    store.delete(_key(1))  # deleting an absent key is fine
    store.clear()


def test_put_get_contains_delete(store: KVStore) -> None:
    assert store.put(_key(1), b"one") is True
    assert store.put(_key(2), b"two!") is True
    assert store.get(_key(1)) == b"one"
    assert store.get(_key(2)) == b"two!"
    assert store.contains(_key(1))
    assert store.contains(_key(2))
    assert not store.contains(_key(3))
    assert not budgeted(store) or store.used_bytes() == 7
    store.delete(_key(1))
    assert store.get(_key(1)) is None
    assert not store.contains(_key(1))
    assert store.get(_key(2)) == b"two!"
    assert not budgeted(store) or store.used_bytes() == 4
    store.delete(_key(1))
    assert not budgeted(store) or store.used_bytes() == 4


def test_values_are_bytes_exactly(store: KVStore) -> None:
    value = bytes(range(256)) * 10
    assert store.put(_key(5), value)
    got = store.get(_key(5))
    assert isinstance(got, bytes)
    assert got == value


def test_get_into_reads_what_get_reads_whatever_the_buffer(store: KVStore) -> None:
    long, short = bytes(range(256)) * 8, b"short entry"
    assert store.put(_key(1), long) and store.put(_key(2), short) and store.put(_key(3), b"")
    buffer = bytearray(len(long) + 1)
    for _ in range(2):  # one buffer reused: a shorter entry after a longer one
        for key, value in ((1, long), (2, short), (3, b"")):
            got = store.get_into(_key(key), buffer)
            assert got is not None and bytes(got) == value
    got = store.get_into(_key(1), bytearray(16))  # too small: the entry comes whole
    assert got is not None and bytes(got) == long
    assert store.get_into(_key(4), buffer) is None


def test_values_given_as_parts_are_their_concatenation(store: KVStore) -> None:
    layer = memoryview(bytearray(range(256)) * 4)
    parts = [b"head", layer, b"", layer[:7], bytes(100)]
    stored = store.put_many_parts([(_key(1), parts), (_key(2), [b"one piece"]), (_key(3), [])])
    assert stored == [True, True, True]
    assert store.get(_key(1)) == b"".join(parts)
    assert store.get(_key(2)) == b"one piece"
    assert store.get(_key(3)) == b""
    assert not budgeted(store) or store.used_bytes() == len(b"".join(parts)) + 9


def test_values_given_as_parts_respect_the_capacity(make_store: MakeStore) -> None:
    store = make_store(100)
    if not budgeted(store):
        pytest.skip("the server enforces the budget")
    assert store.put_many_parts([(_key(1), [bytes(60), bytes(41)])]) == [False]
    assert store.put_many_parts([(_key(2), [bytes(60), bytes(40)])]) == [True]
    assert not store.contains(_key(1))
    assert store.used_bytes() == 100


def test_empty_value(store: KVStore) -> None:
    assert store.put(_key(1), b"")
    assert store.contains(_key(1))
    assert store.get(_key(1)) == b""


def test_keys_are_distinct(store: KVStore) -> None:
    keys = [_key(i) for i in range(50)] + [b"\x00" * 16, b"\xff" * 16, b"\x00" * 15 + b"\x01"]
    keys = list(dict.fromkeys(keys))
    for i, key in enumerate(keys):
        assert store.put(key, f"value-{i}".encode())
    for i, key in enumerate(keys):
        assert store.get(key) == f"value-{i}".encode()


def test_re_put_keeps_one_value(store: KVStore) -> None:
    assert store.put(_key(1), b"first")
    assert store.put(_key(1), b"other")
    assert store.get(_key(1)) in (b"first", b"other")
    assert not budgeted(store) or store.used_bytes() == 5


def test_clear(store: KVStore) -> None:
    for i in range(10):
        store.put(_key(i), b"x" * 10)
    store.clear()
    assert not budgeted(store) or store.used_bytes() == 0
    for i in range(10):
        assert not store.contains(_key(i))
        assert store.get(_key(i)) is None
    assert store.put(_key(1), b"again")
    assert store.get(_key(1)) == b"again"


def test_count_prefix(store: KVStore) -> None:
    keys = [_key(i) for i in range(6)]
    for key in keys[:3] + keys[4:]:
        store.put(key, b"v")
    assert store.count_prefix(keys) == 3
    assert store.count_prefix(keys[:2]) == 2
    assert store.count_prefix(keys[3:]) == 0
    assert store.count_prefix(keys[4:]) == 2
    assert store.count_prefix([]) == 0
    store.delete(keys[0])
    assert store.count_prefix(keys) == 0


def test_used_bytes_never_exceeds_capacity(make_store: MakeStore) -> None:
    capacity = 1000
    store = make_store(capacity)
    if not budgeted(store):
        pytest.skip("the server, not the store, enforces the budget (maxmemory)")
    rng = random.Random(7)
    for i in range(200):
        value = bytes([i % 256]) * rng.randrange(1, 300)
        assert store.put(_key(i), value)
        assert store.used_bytes() <= capacity
        assert _occupied_bytes(store) <= capacity
        assert store.used_bytes() == _entry_bytes(store)
    assert store.used_bytes() > 0


def test_entries_that_remain_are_intact(make_store: MakeStore) -> None:
    store = make_store(2000)
    if not budgeted(store):
        pytest.skip("the server, not the store, enforces the budget (maxmemory)")
    values = {_key(i): bytes([i]) * (50 + i) for i in range(100)}
    for key, value in values.items():
        store.put(key, value)
    held = [key for key in values if store.contains(key)]
    assert held
    for key in held:
        assert store.get(key) == values[key]


def test_entry_larger_than_capacity_is_refused(make_store: MakeStore) -> None:
    store = make_store(100)
    if not budgeted(store):
        pytest.skip("the server, not the store, enforces the budget (maxmemory)")
    assert store.put(_key(1), b"a" * 40)
    assert store.put(_key(2), b"b" * 101) is False
    assert not store.contains(_key(2))
    assert store.get(_key(2)) is None
    assert store.get(_key(1)) == b"a" * 40
    assert not budgeted(store) or store.used_bytes() == 40
    assert _entry_bytes(store) == 40


def test_entry_of_exactly_capacity_fits_an_empty_store(make_store: MakeStore) -> None:
    store = make_store(100)
    if not budgeted(store):
        pytest.skip("the server, not the store, enforces the budget (maxmemory)")
    assert store.put(_key(1), b"a" * 100)
    assert store.get(_key(1)) == b"a" * 100
    assert not budgeted(store) or store.used_bytes() == 100


def test_zero_capacity_store_refuses_everything_nonempty(make_store: MakeStore) -> None:
    store = make_store(0)
    if not budgeted(store):
        pytest.skip("the server, not the store, enforces the budget (maxmemory)")
    assert store.put(_key(1), b"a") is False
    assert not store.contains(_key(1))
    assert not budgeted(store) or store.used_bytes() == 0


def test_concurrent_puts_and_gets(make_store: MakeStore) -> None:
    store = make_store(64 * 1024)
    threads = 8
    rounds = 150
    shared = [_key(10_000 + i) for i in range(16)]
    written: dict[bytes, set[bytes]] = defaultdict(set)
    written_lock = threading.Lock()
    errors: list[BaseException] = []
    bad_reads: list[tuple[bytes, bytes]] = []
    barrier = threading.Barrier(threads)

    def record(key: bytes, value: bytes) -> None:
        with written_lock:
            written[key].add(value)

    def check(key: bytes, value: bytes | None) -> None:
        if value is None:
            return
        with written_lock:
            ok = value in written[key]
        if not ok:
            bad_reads.append((key, value))

    def work(tid: int) -> None:
        rng = random.Random(tid)
        try:
            barrier.wait()
            for n in range(rounds):
                own = _key(tid * 1000 + n % 40)
                key = own if n % 2 else rng.choice(shared)
                value = key + bytes([tid, n % 256]) * rng.randrange(1, 200)
                record(key, value)
                store.put(key, value)
                check(key, store.get(key))
                probe = rng.choice(shared)
                check(probe, store.get(probe))
                store.contains(probe)
                store.count_prefix(shared[:4])
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert bad_reads == []
    assert not budgeted(store) or _entry_bytes(store) <= store.capacity
    # everything still held reads back as a value written for its key
    for key in list(written):
        value = store.get(key)
        if value is not None:
            assert value in written[key]


def test_the_generation_record_is_kept_as_written(store: KVStore) -> None:
    assert store.read_generation() is None
    store.write_generation(b"kvmux-generation-v1 one")
    store.write_generation(b"kvmux-generation-v1 two")
    assert store.read_generation() == b"kvmux-generation-v1 two"
    assert store.put(_key(1), b"kept")  # a reset moves keys; it does not touch entries
    assert store.get(_key(1)) == b"kept"
