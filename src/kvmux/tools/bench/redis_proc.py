"""A throwaway redis-server for the benchmarks: own port and directory, no persistence."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["POLICY", "RedisProcess"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# as the README asks of a Redis used as a cache: when full, old entries make room (with
# Redis's default, noeviction, every write past maxmemory fails and later prompts miss)
POLICY = "allkeys-lru"


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
