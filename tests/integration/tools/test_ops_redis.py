"""kvmux ls | stats | verify | purge against real redis-server processes (standalone, cluster)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kvmux.cli import main
from kvmux.config import RedisSpec
from kvmux.stores.redis import RedisStore
from kvmux.tier.scheduler.generation import encode_record, new_generation
from tests.support.redis_server import RedisServer
from tests.support.tier_entries import signing_keys, write_model

PART_SIZE = 1000  # entries of about 2 KiB are split into three parts


def _spec(url: str, cluster: bool = False) -> dict[str, Any]:
    prefix = f"ops-{uuid.uuid4().hex[:12]}:"
    return {
        "type": "redis",
        "url": url,
        "cluster": cluster,
        "key_prefix": prefix,
        "max_value_size": PART_SIZE,
    }


def _store(spec: dict[str, Any]) -> RedisStore:
    fields = {k: v for k, v in spec.items() if k != "type"}
    return RedisStore(RedisSpec(**fields))


@pytest.fixture
def tier(redis_server: RedisServer) -> Iterator[tuple[dict[str, Any], RedisStore]]:
    spec = _spec(redis_server.url)
    store = _store(spec)
    yield spec, store
    store.clear()
    store.close()


def _run(capsys: pytest.CaptureFixture[str], command: str, spec: dict[str, Any], *extra: str):
    code = main([command, "--store", json.dumps(spec), "--quiet", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _doc(text: str) -> dict[str, Any]:
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


def _names(store: RedisStore) -> set[str]:
    client = store._connect()
    return {n.decode() for n in client.scan_iter(match=f"{store.spec.key_prefix}*")}


def _name(store: RedisStore, key: bytes) -> str:
    return f"{store.spec.key_prefix}{{{key.hex()}}}"


def _parts(store: RedisStore, key: bytes) -> set[str]:
    return {n for n in _names(store) if n.startswith(_name(store, key) + ":")}


def test_ls_and_stats_walk_entries_not_parts(tier, capsys) -> None:
    spec, store = tier
    llama = write_model(store, "llama", 4)
    qwen = write_model(store, "qwen", 2, signing_keys("k1"))
    assert all(len(_parts(store, k)) == 3 for k in llama.keys)  # split into parts
    code, out, _ = _run(capsys, "ls", spec, "--json")
    rows = {row["key"]: row for row in map(json.loads, out.splitlines())}
    assert code == 0 and set(rows) == {k.hex() for k in llama.keys + qwen.keys}
    for written in (llama, qwen):
        for key, value in written.values.items():
            assert rows[key.hex()]["size"] == len(value)  # the whole entry, not the manifest
            assert rows[key.hex()]["namespace"] == written.namespace.hex()
    assert {rows[k.hex()]["kid"] for k in qwen.keys} == {"k1"}
    code, out, _ = _run(capsys, "stats", spec, "--json")
    document = _doc(out)
    assert code == 0 and document["entries"] == 6
    assert [(n["namespace"], n["entries"], n["signed"]) for n in document["namespaces"]] == [
        (llama.namespace.hex(), 4, 0),
        (qwen.namespace.hex(), 2, 2),
    ]
    assert document["tier"]["location"] == f"{spec['url']} {spec['key_prefix']}"


def _plant_garbage(store: RedisStore) -> dict[str, str]:
    """Bad entries of every kind next to good ones; the expected status by hex key."""
    written = write_model(store, "llama", 6)
    client, keys = store._connect(), written.keys
    part = sorted(_parts(store, keys[0]))[0]
    client.setrange(part, 500, b"\xff")  # a flipped byte inside a part
    client.delete(sorted(_parts(store, keys[1]))[0])  # a lost part
    wrong_type, bad_manifest, short = bytes(16), bytes([1] * 16), bytes([2] * 16)
    client.lpush(_name(store, wrong_type), b"a list")
    client.set(_name(store, bad_manifest), b"\x00kvmux-parts-v1\x00" + b"\xff" * 28)
    client.set(_name(store, short), b"KVMX")
    client.set(f"{store.spec.key_prefix}foreign", b"not under an entry name")
    store.write_generation(encode_record(new_generation(), None))
    expected = {keys[0]: "corrupt", keys[1]: "unreadable", wrong_type: "unreadable"}
    expected |= {bad_manifest: "unreadable", short: "corrupt"}
    return {key.hex(): status for key, status in expected.items()}


def test_verify_reports_garbage_and_delete_removes_it_with_its_parts(tier, capsys) -> None:
    spec, store = tier
    expected = _plant_garbage(store)
    before = _names(store)
    code, out, _ = _run(capsys, "verify", spec, "--json")
    document = _doc(out)
    assert code == 3 and {p["key"]: p["status"] for p in document["problems"]} == expected
    assert document["counts"] == {"ok": 4, "corrupt": 2, "unreadable": 3}
    assert _names(store) == before
    code, out, _ = _run(capsys, "verify", spec, "--delete")
    assert code == 3 and "removed 5 bad entries" in out
    left = _names(store)
    for key in expected:
        assert not any(key in name for name in left)  # the entry and every part of it
    assert f"{spec['key_prefix']}foreign" in left and f"{spec['key_prefix']}generation" in left
    assert len(left) == 2 + 4 * 4  # foreign, generation, 4 good entries of 1 + 3 parts
    assert _run(capsys, "verify", spec)[0] == 0


def test_purge_all_and_by_namespace(tier, capsys) -> None:
    spec, store = tier
    llama, qwen = write_model(store, "llama", 3), write_model(store, "qwen", 2)
    store.write_generation(encode_record(new_generation(), None))
    code, out, _ = _run(capsys, "purge", spec, "--namespace", llama.namespace.hex()[:12])
    assert code == 0 and "removed 3 entries" in out
    assert all(not _parts(store, k) for k in llama.keys)
    code, out, _ = _run(capsys, "purge", spec, "--all", "--dry-run", "--json")
    assert code == 0 and _doc(out)["entries"] == 2 and _doc(out)["removed"] == 0
    assert all(len(_parts(store, k)) == 3 for k in qwen.keys)
    code, out, _ = _run(capsys, "purge", spec, "--all", "--json")
    assert code == 0 and _doc(out)["removed"] == 2
    assert _names(store) == {f"{spec['key_prefix']}generation"}  # the generation stays


def _idle(store: RedisStore, key: bytes) -> int:
    return int(store._connect().object("idletime", _name(store, key)))


def test_purge_by_age_never_reads_younger_entries(tier, capsys) -> None:
    spec, store = tier
    old = write_model(store, "llama", 2)
    time.sleep(3.2)  # idle times count whole seconds of the server's LRU clock: margins
    young = write_model(store, "qwen", 2)
    time.sleep(1.2)
    code, out, _ = _run(capsys, "purge", spec, "--older-than", "3s", "--json")
    document = _doc(out)
    assert code == 0 and document["removed"] == 2
    assert [n["namespace"] for n in document["namespaces"]] == [old.namespace.hex()]
    assert all(_idle(store, key) >= 1 for key in young.keys)  # their recency untouched
    assert {e.key for e in store.walk()} == set(young.keys)


def test_reads_leave_idle_times_alone_where_the_server_can(tier, capsys) -> None:
    spec, store = tier
    version = store._connect().info("server")["redis_version"]
    if tuple(int(part) for part in version.split(".")[:2]) < (7, 2):
        pytest.skip(f"CLIENT NO-TOUCH needs Redis or Valkey 7.2 (server: {version})")
    written = write_model(store, "llama", 2)
    time.sleep(2.2)
    for command in ("ls", "stats", "verify"):
        assert _run(capsys, command, spec)[0] == 0
    assert all(_idle(store, key) >= 2 for key in written.keys)


def test_a_wrong_max_value_size_stops_before_anything_is_removed(tier, capsys) -> None:
    spec, store = tier
    write_model(store, "llama", 2)
    before = _names(store)
    wrong = {**spec, "max_value_size": "64MiB"}
    code, _, err = _run(capsys, "verify", wrong, "--delete")
    assert code == 1 and "'store.max_value_size'" in err and "parts of 1000 bytes" in err
    assert _names(store) == before


@pytest.fixture(scope="module")
def lfu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server whose eviction policy keeps access counts, not idle times."""
    extra = ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lfu"]
    server = RedisServer(tmp_path_factory.mktemp("redis-lfu"), extra=extra).start()
    yield server
    server.kill()


def test_an_lfu_server_has_no_ages_and_age_purges_pass_over(lfu_server, capsys) -> None:
    spec = _spec(lfu_server.url)
    store = _store(spec)
    write_model(store, "llama", 2)
    _, out, _ = _run(capsys, "ls", spec, "--json")
    assert [json.loads(line)["age"] for line in out.splitlines()] == [None, None]
    code, out, _ = _run(capsys, "purge", spec, "--older-than", "1s")
    assert code == 0 and "removed 0 entries" in out and "passed over: 2 of unknown age" in out
    assert len(list(store.walk())) == 2


def test_cluster_tier(redis_cluster, capsys) -> None:
    spec = _spec(redis_cluster.url, cluster=True)
    store = _store(spec)
    llama = write_model(store, "llama", 12)  # spread over the three masters' slots
    qwen = write_model(store, "qwen", 3)
    store._connect().lpush(_name(store, bytes(16)), b"garbage")
    code, out, _ = _run(capsys, "ls", spec, "--json")
    assert code == 0 and len(out.splitlines()) == 16
    code, out, _ = _run(capsys, "stats", spec, "--json")
    assert [n["entries"] for n in _doc(out)["namespaces"]] == [12, 3, 1]
    code, out, _ = _run(capsys, "verify", spec, "--delete", "--json")
    assert code == 3 and _doc(out)["removed"] == 1
    code, out, _ = _run(capsys, "purge", spec, "--namespace", qwen.namespace.hex())
    assert code == 0 and {e.key for e in store.walk()} == set(llama.keys)
    assert _run(capsys, "purge", spec, "--all")[0] == 0
    assert list(store.walk()) == []
    store.clear()


def test_the_redis_shortcut(redis_server, capsys, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_server.url)
    spec = {"type": "redis", "url": redis_server.url}  # the default prefix kvmux:
    if client.exists("kvmux:generation") or any(client.scan_iter(match="kvmux:{*}", count=100)):
        pytest.skip("the shared server holds kvmux: entries of another test")
    store = _store(spec)
    written = write_model(store, "llama", 2)
    try:
        code = main(["stats", "--redis", redis_server.url, "--json", "--quiet"])
        document = _doc(capsys.readouterr().out)
        assert code == 0 and document["entries"] == 2
        assert document["namespaces"][0]["namespace"] == written.namespace.hex()
    finally:
        store.delete_many(written.keys)
