"""Peers that run beside vLLM: LMCache's server, in its own virtual environment."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from benchmarks.configs import LMCACHE_PORT

__all__ = ["LMCacheServer"]


class LMCacheServer:
    """``lmcache server`` from the venv that holds LMCache (it downgrades vLLM's packages)."""

    def __init__(self, python: Path, workdir: Path, l1_gb: int = 2):
        self.python = python
        self.workdir = workdir
        self.l1_gb = l1_gb
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> LMCacheServer:
        """Start the server and wait until it accepts connections."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.python.parent / "lmcache"),
            "server",
            "--port",
            str(LMCACHE_PORT),
            "--http-port",
            "18080",
            "--chunk-size",
            "256",
            "--l1-size-gb",
            str(self.l1_gb),
            "--eviction-policy",
            "LRU",
            "--supported-transfer-mode",
            "auto",
        ]
        with open(self.workdir / "lmcache-server.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"lmcache server exited with {self.proc.returncode}: {self.log_tail()}"
                )
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", LMCACHE_PORT)) == 0:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"lmcache server did not listen on {LMCACHE_PORT}: {self.log_tail()}")

    def log_tail(self) -> str:
        """The end of the server's log."""
        path = self.workdir / "lmcache-server.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else ""

    def stop(self) -> None:
        """Stop the server."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
