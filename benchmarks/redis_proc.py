"""The benchmarks' Redis tier: a throwaway redis-server that evicts as a cache, and its filler."""

from __future__ import annotations

from pathlib import Path

import redis

from kvmux.testing.redis_server import RedisServer

__all__ = ["FILLER_PREFIX", "POLICY", "RedisProcess"]

# as the README asks of a Redis used as a cache: when full, old entries make room (with
# Redis's default, noeviction, every write past maxmemory fails and later prompts miss)
POLICY = "allkeys-lru"
FILLER_PREFIX = "bench-filler:"  # what ``fill`` writes (never a benchmark's key prefix)
FILL_BATCH = 16  # filler writes per round trip


class RedisProcess(RedisServer):
    """``kvmux.testing``'s redis-server with a memory budget and an eviction policy."""

    def __init__(self, workdir: Path, maxmemory: int = 4 * 10**9, maxmemory_policy: str = POLICY):
        limits = ["--maxmemory", str(maxmemory), "--maxmemory-policy", maxmemory_policy]
        super().__init__(workdir, extra=limits)
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy

    def fill(self, value_bytes: int, share: float = 0.99) -> int:
        """Fill the server with filler entries up to ``share`` of maxmemory; how many.

        A cache tier that has been serving is full and evicts: each write reuses the
        memory an evicted entry gave back. An empty server grows instead, page by page,
        which on a VM whose host reclaims free memory costs far more than the writes
        themselves (docs/benchmarks.md). Filler keys are never read again, so
        allkeys-lru evicts them before anything a benchmark wrote.
        """
        client = redis.Redis.from_url(self.url)
        value, count, goal = b"\0" * value_bytes, 0, share * self.maxmemory
        try:
            while (room := goal - int(client.info("memory")["used_memory"])) > 0:
                pipe = client.pipeline(transaction=False)
                # an entry takes more than its bytes: near the goal, fill in smaller steps
                for _ in range(min(FILL_BATCH, max(1, int(room // (2 * value_bytes))))):
                    pipe.set(f"{FILLER_PREFIX}{count}", value)
                    count += 1
                pipe.execute()
        finally:
            client.close()
        return count
