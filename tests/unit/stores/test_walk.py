"""What operators' tools need of every store: walk, head, delete_many, reads without touch."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvmux.config import RedisSpec
from kvmux.errors import ConfigError
from kvmux.stores import DictStore, DiskStore, KVStore
from kvmux.stores.redis import RedisStore
from kvmux.stores.redis_walk import entry_key, entry_pattern, no_touch_hook
from kvmux.tier.scheduler.generation import encode_record, new_generation

MakeStore = Callable[..., KVStore]


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _redis(url: str, cluster: bool = False, max_value_size: int = 64 << 20, **kw) -> RedisStore:
    spec = RedisSpec(
        url=url,
        cluster=cluster,
        key_prefix=f"walk-{uuid.uuid4().hex}:",
        max_value_size=max_value_size,
    )
    return RedisStore(spec, **kw)


SERVERS = ["redis", "valkey"]  # the Redis tier's store, on redis-server and on valkey-server
STORES = ["dict", "disk"] + [f"{s}{v}" for s in SERVERS for v in ("", "-split", "-cluster")]


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    opened: list[KVStore] = []

    def make(touch: bool = True) -> KVStore:
        store: KVStore
        if request.param == "dict":
            store = DictStore(1 << 20)
        elif request.param == "disk":
            store = DiskStore(tmp_path / "disk", 1 << 20, touch=touch)
        else:  # "redis", "valkey-split", "redis-cluster"...: a RedisStore on that server
            server, _, kind = request.param.partition("-")
            fixture = f"{server}_cluster" if kind == "cluster" else f"{server}_server"
            url = request.getfixturevalue(fixture).url
            split = 5 if kind == "split" else 64 << 20  # split: every entry over 5 bytes
            store = _redis(url, kind == "cluster", split, touch=touch)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_walk_finds_every_entry_once_with_its_size(make_store) -> None:
    store = make_store()
    values = {_key(i): os.urandom(i % 23) for i in range(700)}  # more than one SCAN batch
    for key, value in values.items():
        assert store.put(key, value)
    found = list(store.walk())
    assert sorted(e.key for e in found) == sorted(values)
    assert {e.key: e.size for e in found} == {k: len(v) for k, v in values.items()}
    if isinstance(store, DiskStore):
        assert all(e.age is not None and 0 <= e.age < 60 for e in found)
    elif not isinstance(store, DictStore):  # Redis idle times: the server's coarse clock
        assert all(e.age is None or e.age >= 0 for e in found)


def test_walk_skips_what_no_key_names(make_store) -> None:
    store = make_store()
    store.put(_key(1), b"entry")
    store.write_generation(encode_record(new_generation(), None))
    if isinstance(store, RedisStore):
        client = store._connect()
        client.set(f"{store.spec.key_prefix}other", b"x")
        client.set(f"{store.spec.key_prefix}{{zz}}", b"x")
    if isinstance(store, DiskStore):
        (store.root / "zz").mkdir()
        (store.root / "zz" / "zz.kvx").write_bytes(b"x")
        (store.root / "ab").mkdir()
        (store.root / "ab" / "cd.kvx").write_bytes(b"x")  # not in its shard
    assert [e.key for e in store.walk()] == [_key(1)]


def test_head_reads_the_first_bytes(make_store) -> None:
    store = make_store()
    store.put(_key(1), b"0123456789abcdef")
    store.put(_key(2), b"")
    assert store.head(_key(1), 7) == b"0123456"
    assert store.head_many([_key(1), _key(2), _key(3)], 100) == [b"0123456789abcdef", b"", None]


def test_delete_many_removes_entries_and_their_parts(make_store) -> None:
    store = make_store()
    for i in range(10):
        store.put(_key(i), os.urandom(20))
    store.delete_many([_key(i) for i in range(0, 10, 2)] + [_key(99)])
    assert sorted(e.key for e in store.walk()) == [_key(i) for i in range(1, 10, 2)]
    store.delete_many([])
    if isinstance(store, RedisStore):
        left = list(store._connect().scan_iter(match=f"{store.spec.key_prefix}*"))
        parts = 4 if store.spec.max_value_size == 5 else 0  # 20 bytes: 4 parts of 5
        assert len(left) == 5 * (1 + parts)


def test_reads_without_touch_leave_disk_recency_alone(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "disk", 1 << 20, touch=False)
    store.put(_key(1), b"entry")
    path = next(store.root.glob("*/*.kvx"))
    os.utime(path, (time.time() - 3600,) * 2)
    before = path.stat().st_mtime
    assert store.get(_key(1)) == b"entry" and store.head(_key(1), 2) == b"en"
    assert path.stat().st_mtime == before
    assert DiskStore(tmp_path / "disk", 1 << 20).get(_key(1)) == b"entry"
    assert path.stat().st_mtime > before  # an engine's read refreshes it


@pytest.mark.parametrize("server", ["redis_server", "valkey_server"])
def test_redis_ages_are_idle_times(server: str, request: pytest.FixtureRequest) -> None:
    writer = _redis(request.getfixturevalue(server).url)
    tools = RedisStore(writer.spec, touch=False)
    writer.put(_key(1), b"old")
    time.sleep(2.2)
    writer.put(_key(2), b"new")
    ages = {e.key: e.age for e in tools.walk()}
    assert ages[_key(1)] is not None and ages[_key(1)] >= 2 and ages[_key(2)] < 2


def test_redis_walk_refuses_entries_split_with_another_size(redis_server) -> None:
    writer = _redis(redis_server.url, max_value_size=10)
    writer.put(_key(1), os.urandom(35))
    spec = RedisSpec(url=redis_server.url, key_prefix=writer.spec.key_prefix)
    with pytest.raises(ConfigError, match=r"store.max_value_size.*parts of 10 bytes"):
        list(RedisStore(spec, touch=False).walk())
    garbage = _redis(redis_server.url)  # a manifest no writer could have made: just garbage
    part = b"\x00kvmux-parts-v1\x00" + (3).to_bytes(4, "little") + (35).to_bytes(8, "little")
    garbage._connect().set(f"{garbage.spec.key_prefix}{{{_key(2).hex()}}}", part + bytes(16))
    assert [(e.key, e.size) for e in garbage.walk()] == [(_key(2), len(part) + 16)]


def test_entry_names() -> None:
    assert entry_pattern("kv*[x]?\\:") == "kv\\*\\[x\\]\\?\\\\:{*}"
    assert entry_key(b"p:{00ff}", "p:") == b"\x00\xff"
    for name in (b"p:{00ff}:nonce:1", b"p:generation", b"q:{00ff}", b"p:{0f}x", b"p:{0g}", b"p:{}"):
        assert entry_key(name, "p:") is None


class _Connection:
    def __init__(self, reply: Exception | None):
        self.reply, self.sent, self.handshakes = reply, [], 0

    def on_connect(self) -> None:
        self.handshakes += 1

    def send_command(self, *args: str) -> None:
        self.sent.append(args)

    def read_response(self) -> bytes:
        if self.reply is not None:
            raise self.reply
        return b"OK"


@pytest.mark.parametrize("cluster", [False, True])
def test_no_touch_hook_asks_and_tolerates_older_servers(cluster: bool) -> None:
    import redis

    hook = no_touch_hook(cluster, redis.exceptions.ResponseError)
    for reply in (None, redis.exceptions.ResponseError("ERR unknown subcommand 'NO-TOUCH'")):
        connection = _Connection(reply)
        hook(connection)
        assert connection.sent == [("CLIENT", "NO-TOUCH", "ON")]
        assert connection.handshakes == (0 if cluster else 1)  # the cluster client's own


def test_redis_walk_reports_a_name_scan_repeats_once(redis_server, monkeypatch) -> None:
    store = _redis(redis_server.url)
    for i in range(3):
        store.put(_key(i), b"entry")
    client, scan_iter = store._connect(), store._connect().scan_iter
    twice = lambda **options: (n for name in scan_iter(**options) for n in (name, name))  # noqa: E731
    monkeypatch.setattr(client, "scan_iter", twice)  # SCAN may return a name again
    assert sorted(e.key for e in store.walk()) == [_key(0), _key(1), _key(2)]
