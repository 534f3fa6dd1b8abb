"""Redis behaviour against real redis-server processes: TLS, ACL, failures, memory limits."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kvmux.config import RedisSpec, parse_store_spec
from kvmux.errors import ConfigError, StoreError, StoreUnavailable
from kvmux.keys import BlockKey, store_key
from kvmux.metrics import TierStats
from kvmux.stores.base import GENERATION_RECORD_MAX, KVStore
from kvmux.stores.dict_store import DictStore
from kvmux.stores.redis import RedisStore
from kvmux.tier.scheduler.index import RemoteStoreView
from tests.support.redis_server import RedisServer, make_tls_files


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _spec(url: str, **fields: object) -> RedisSpec:
    prefix = f"t-{uuid.uuid4().hex}:"
    return RedisSpec(url=url, key_prefix=prefix, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """TLS with a throwaway CA, the default user disabled, one ACL user."""
    folder = tmp_path_factory.mktemp("redis-tls")
    tls = make_tls_files(folder / "certs")
    acl = ["user default off", "user alice on >s3cret ~* &* +@all"]
    server = RedisServer(folder / "data", tls=tls, conf_lines=acl).start()
    yield server
    server.kill()


def test_tls_and_acl_user_with_password_from_environment(secure_server, monkeypatch) -> None:
    tls = secure_server.tls
    monkeypatch.setenv("KVMUX_TEST_REDIS_PASSWORD", "s3cret")
    spec = parse_store_spec(
        {
            "type": "redis",
            "url": secure_server.url,
            "username": "alice",
            "password_env": "KVMUX_TEST_REDIS_PASSWORD",
            "ca_cert": str(tls.ca),
            "cert": str(tls.client_cert),
            "key": str(tls.client_key),
            "key_prefix": "tls-test:",
        }
    )
    store = RedisStore(spec)  # type: ignore[arg-type]
    assert store.put(_key(1), b"over tls")
    assert store.get(_key(1)) == b"over tls"
    assert "tls-test:" in secure_server.cli("--scan", auth=("alice", "s3cret"))


def test_credentials_in_the_url(secure_server) -> None:
    tls = secure_server.tls
    url = secure_server.url.replace("rediss://", "rediss://alice:s3cret@")
    store = RedisStore(_spec(url, ca_cert=str(tls.ca)))
    assert store.put(_key(2), b"x") and store.get(_key(2)) == b"x"


def test_wrong_password_is_a_store_error_not_a_crash(secure_server) -> None:
    tls = secure_server.tls
    url = secure_server.url.replace("rediss://", "rediss://alice:wrong@")
    store = RedisStore(_spec(url, ca_cert=str(tls.ca)))
    with pytest.raises(StoreError):
        store.get(_key(1))


def test_untrusted_server_certificate_is_refused(secure_server, tmp_path: Path) -> None:
    other_ca = make_tls_files(tmp_path / "other").ca
    url = secure_server.url.replace("rediss://", "rediss://alice:s3cret@")
    with pytest.raises(StoreError):
        RedisStore(_spec(url, ca_cert=str(other_ca))).get(_key(1))


def test_missing_password_variable_is_a_config_error(monkeypatch) -> None:
    monkeypatch.delenv("KVMUX_NOT_SET", raising=False)
    with pytest.raises(ConfigError, match="KVMUX_NOT_SET"):
        RedisStore(_spec("redis://127.0.0.1:1/0", password_env="KVMUX_NOT_SET"))


def test_server_down_then_back(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "flaky").start()
    clock = [0.0]
    store = RedisStore(_spec(server.url, breaker_seconds=5.0))
    store._breaker._clock = lambda: clock[0]  # the breaker's back-off, without waiting
    assert store.put(_key(1), b"before")
    server.kill()
    with pytest.raises(StoreUnavailable):
        store.get(_key(1))
    assert store._breaker.state == "open"
    with pytest.raises(StoreUnavailable, match="marked down"):  # no network call while open
        store.contains(_key(1))
    server.start()  # restarted empty, same port
    with pytest.raises(StoreUnavailable, match="marked down"):
        store.contains(_key(1))
    clock[0] += 5.0  # back-off over: one trial call goes through and closes the breaker
    assert store.get(_key(1)) is None
    assert store._breaker.state == "closed"
    assert store.put(_key(1), b"after") and store.get(_key(1)) == b"after"
    server.kill()


def test_a_save_in_pieces_lands_whole_and_a_failed_one_frees_the_join_buffer(
    tmp_path: Path,
) -> None:
    """Pieces are joined into reused memory; a write that fails leaves it free for the next."""
    server = RedisServer(tmp_path / "pieces").start()
    store = RedisStore(_spec(server.url))
    store._joiner.size = 100  # two round trips for these three entries
    items = [(_key(i), [b"head", bytes([i]) * 40, memoryview(b"tail")]) for i in range(3)]
    assert store.put_many_parts(items) == [True, True, True]
    assert [store.get(_key(i)) for i in range(3)] == [
        b"head" + bytes([i]) * 40 + b"tail" for i in range(3)
    ]
    server.kill()
    with pytest.raises(StoreUnavailable):
        store.put_many_parts(items)
    assert not store._joiner._lock.locked()


def test_noeviction_server_refuses_writes_when_full(tmp_path: Path) -> None:
    server = RedisServer(
        tmp_path / "full", ["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]
    )
    server.start()
    store = RedisStore(_spec(server.url))
    stored = [store.put(_key(i), bytes(64 * 1024)) for i in range(200)]
    assert stored[0] and not stored[-1]  # refused once full, without raising
    assert store.get(_key(0)) == bytes(64 * 1024)  # reads still work
    assert store.get(_key(199)) is None
    server.kill()


def test_lru_server_evicts_and_evicted_entries_are_misses(tmp_path: Path) -> None:
    server = RedisServer(
        tmp_path / "lru", ["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]
    )
    server.start()
    store = RedisStore(_spec(server.url))
    for i in range(100):
        assert store.put(_key(i), bytes([i]) * 64 * 1024)
    values = store.get_many([_key(i) for i in range(100)])
    assert values[0] is None  # the oldest were evicted
    assert all(v is None or v == bytes([i]) * 64 * 1024 for i, v in enumerate(values))
    server.kill()


def test_ttl_expires_entries(redis_server) -> None:
    store = RedisStore(_spec(redis_server.url, ttl_seconds=100))
    store.put(_key(1), b"v")
    ttl = int(redis_server.cli("ttl", f"{store.spec.key_prefix}{{{_key(1).hex()}}}"))
    assert 0 < ttl <= 100


def test_split_entries_round_trip_and_delete_their_parts(redis_server) -> None:
    store = RedisStore(_spec(redis_server.url, max_value_size=1000))
    value = bytes(range(256)) * 20  # 5120 bytes: six parts
    store.put(_key(1), value)
    assert store.get(_key(1)) == value
    keys = redis_server.cli("--scan", "--pattern", f"{store.spec.key_prefix}*").split()
    assert len(keys) == 7  # the manifest and six parts
    store.delete(_key(1))
    assert redis_server.cli("--scan", "--pattern", f"{store.spec.key_prefix}*").split() == []


def test_a_missing_part_is_a_miss(redis_server) -> None:
    store = RedisStore(_spec(redis_server.url, max_value_size=1000))
    store.put(_key(1), bytes(3000))
    part = redis_server.cli("--scan", "--pattern", f"{store.spec.key_prefix}*:2").split()[0]
    redis_server.cli("del", part)
    assert store.get(_key(1)) is None


def test_redis_spec_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"store\.url"):
        parse_store_spec({"type": "redis", "url": "http://x"})
    with pytest.raises(ConfigError, match=r"store\.ttl_seconds"):
        parse_store_spec({"type": "redis", "url": "redis://x", "ttl_seconds": -1})
    with pytest.raises(ConfigError, match=r"store\.cluster"):
        parse_store_spec({"type": "redis", "url": "redis://x", "cluster": "yes"})
    with pytest.raises(ConfigError, match=r"store\.key_prefix"):
        parse_store_spec({"type": "redis", "url": "redis://x", "key_prefix": "{a}"})


class _SlowStore(DictStore):
    """A store whose lookups block until released."""

    def __init__(self) -> None:
        super().__init__(1 << 20, name="slow")
        self.release = threading.Event()

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        self.release.wait(10)
        return super().count_prefix(keys)


def test_lookups_in_flight_of_prompts_sharing_a_first_block_are_not_shared() -> None:
    """Two prompts of one length whose first blocks agree get each its own answer."""
    store = _SlowStore()
    for i in (1, 2):
        store.put(store_key(BlockKey(_key(i)), 0), b"v")
    view = RemoteStoreView(store, TierStats(), wait_seconds=0.001)
    held = [BlockKey(_key(1)), BlockKey(_key(2))]  # both blocks in the tier
    other = [BlockKey(_key(1)), BlockKey(_key(3))]  # the same first block, then a miss
    assert view.count_prefix_nowait(held) is None
    assert view.count_prefix_nowait(other) is None
    store.release.set()
    for keys in (held, other):
        view._in_flight[(keys[0], keys[-1], 2)].result()
    assert view.count_prefix_nowait(held) == 2
    assert view.count_prefix_nowait(other) == 1
    view.close()


def test_slow_lookup_answers_none_until_it_lands() -> None:
    store: KVStore = _SlowStore()
    store.put(store_key(BlockKey(_key(1)), 0), b"v")
    view = RemoteStoreView(store, TierStats(), wait_seconds=0.001)
    keys = [BlockKey(_key(1)), BlockKey(_key(2))]
    assert view.count_prefix_nowait(keys) is None  # in flight: vLLM asks again next step
    assert view.count_prefix_nowait(keys) is None
    store.release.set()  # type: ignore[attr-defined]
    view._in_flight[(keys[0], keys[-1], 2)].result()
    assert view.count_prefix_nowait(keys) == 1
    view.close()


def test_the_generation_is_shared_by_every_engine_on_the_prefix(redis_server) -> None:
    one = RedisStore(RedisSpec(url=redis_server.url, key_prefix="kvmux-gen-a:"))
    other = RedisStore(RedisSpec(url=redis_server.url, key_prefix="kvmux-gen-a:"))
    elsewhere = RedisStore(RedisSpec(url=redis_server.url, key_prefix="kvmux-gen-b:"))
    try:
        one.write_generation(b"record")
        assert other.read_generation() == b"record"
        assert elsewhere.read_generation() is None
        one._connect().set("kvmux-gen-a:generation", b"9" * 10_000)
        assert other.read_generation() == b"9" * (GENERATION_RECORD_MAX + 1)  # bounded
        one._connect().delete("kvmux-gen-a:generation")
        one._connect().rpush("kvmux-gen-a:generation", b"a list")
        assert other.read_generation() is None  # no record: the engine writes a new one
    finally:
        for store in (one, other, elsewhere):
            store.close()
