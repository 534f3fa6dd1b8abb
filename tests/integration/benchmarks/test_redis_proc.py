"""The benchmark's own redis-server is configured as the README asks of a cache."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from benchmarks.redis_proc import RedisProcess


def test_the_benchmarks_redis_evicts_old_entries_when_full(tmp_path: Path) -> None:
    with RedisProcess(tmp_path / "redis", maxmemory=64 * 2**20) as server:
        client = redis.Redis.from_url(server.url)
        try:
            config = client.config_get("maxmemory*")
            assert config["maxmemory-policy"] == "allkeys-lru"
            assert int(config["maxmemory"]) == 64 * 2**20
            for i in range(48):  # three times maxmemory: writes keep succeeding
                assert client.set(f"k{i}", b"x" * 4 * 2**20)
            assert client.exists("k47") and not client.exists("k0")
        finally:
            client.close()


def test_a_filled_redis_is_full_and_evicts_its_filler_first(tmp_path: Path) -> None:
    with RedisProcess(tmp_path / "redis", maxmemory=64 * 2**20) as server:
        count = server.fill(2**18)
        client = redis.Redis.from_url(server.url)
        try:
            assert int(client.info("memory")["used_memory"]) >= 0.98 * 64 * 2**20
            assert count == client.dbsize() > 128
            assert client.info("stats")["evicted_keys"] == 0  # full, nothing lost yet
            time.sleep(2)  # Redis's LRU clock counts seconds: the filler is now the older
            for i in range(16):  # a quarter of maxmemory, written as a benchmark would
                assert client.set(f"bench:{i}", b"x" * 2**20)
            assert client.info("stats")["evicted_keys"] > 0
            assert all(client.exists(f"bench:{i}") for i in range(16))  # filler went first
            assert client.dbsize() < count + 16
        finally:
            client.close()
