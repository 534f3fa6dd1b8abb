"""A throwaway redis-server for the benchmarks: own port and directory, no persistence."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

__all__ = ["FILLER_PREFIX", "POLICY", "RedisProcess"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# as the README asks of a Redis used as a cache: when full, old entries make room (with
# Redis's default, noeviction, every write past maxmemory fails and later prompts miss)
POLICY = "allkeys-lru"
FILLER_PREFIX = "bench-filler:"  # what ``fill`` writes (never a benchmark's key prefix)
FILL_BATCH = 16  # filler writes per round trip


class RedisProcess:
    """One redis-server on a free loopback port; a context manager that stops it."""

    def __init__(self, workdir: Path, maxmemory: int = 4 * 10**9, maxmemory_policy: str = POLICY):
        self.workdir = workdir
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL clients connect to."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisProcess:
        """Start the server and wait until it accepts connections."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [shutil.which("redis-server") or "redis-server", "--port", str(self.port)]
        argv += ["--bind", "127.0.0.1", "--dir", str(self.workdir), "--protected-mode", "no"]
        argv += ["--save", "", "--appendonly", "no", "--maxmemory", str(self.maxmemory)]
        argv += ["--maxmemory-policy", self.maxmemory_policy]
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.workdir / 'redis.log'}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not open port {self.port}")

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

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
