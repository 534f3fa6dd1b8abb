"""The benchmark's own redis-server is configured as the README asks of a cache."""

from __future__ import annotations

from pathlib import Path

import redis

from kvmux.tools.bench.redis_proc import RedisProcess


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
