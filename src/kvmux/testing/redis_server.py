"""A throwaway redis-server (or valkey-server): own free port and directory, no persistence.

The tests' servers (standalone, TLS, cluster nodes) and the benchmarks' Redis tier are
each one of these; the process is stopped by ``stop`` (or killed, as a crash, by ``kill``).
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

__all__ = ["REDIS_CLI", "REDIS_SERVER", "RedisServer", "TlsFiles", "free_port"]

REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"


def free_port() -> int:
    """A free TCP port on loopback, low enough for the cluster bus (port + 10000)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 45000)
        with socket.socket() as bus, socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair found")


@dataclass
class TlsFiles:
    """A CA with a server and a client certificate signed by it."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


class RedisServer:
    """One redis-server (or ``program``: valkey-server) on a free loopback port, in its own dir.

    ``extra`` arguments follow the built-in ones (``--maxmemory``, ``--cluster-enabled``);
    ``conf_lines`` go to a config file (ACL users); ``tls`` serves TLS only.
    """

    def __init__(
        self,
        workdir: Path,
        extra: list[str] | None = None,
        tls: TlsFiles | None = None,
        conf_lines: list[str] | None = None,
        program: str = REDIS_SERVER,
    ):
        self.workdir = workdir
        self.program = program
        self.conf_lines = list(conf_lines or [])
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.extra = list(extra or [])
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL clients connect to."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        argv = [self.program]
        if self.conf_lines:  # directives such as ACL users are easiest in a file
            conf = self.workdir / "redis.conf"
            conf.write_text("\n".join(self.conf_lines) + "\n")
            argv.append(str(conf))
        argv += ["--bind", "127.0.0.1", "--dir", str(self.workdir)]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        if self.tls:
            argv += ["--port", "0", "--tls-port", str(self.port)]
            argv += ["--tls-cert-file", str(self.tls.server_cert)]
            argv += ["--tls-key-file", str(self.tls.server_key)]
            argv += ["--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "optional"]
        else:
            argv += ["--port", str(self.port)]
        return argv + self.extra

    def start(self, timeout: float = 10.0) -> Self:
        """Start (or restart, empty) the server and wait until it listens."""
        log_path = self.workdir / "redis.log"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{Path(self.program).name} exited; see {log_path}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{Path(self.program).name} did not open port {self.port}")

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

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def cli(self, *args: str, auth: tuple[str, str] | None = None) -> str:
        """Run redis-cli against this server."""
        argv = [REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port)]
        if auth:
            argv += ["--user", auth[0], "--pass", auth[1], "--no-auth-warning"]
        if self.tls:
            argv += ["--tls", "--cacert", str(self.tls.ca)]
            argv += ["--cert", str(self.tls.client_cert), "--key", str(self.tls.client_key)]
        return subprocess.run(
            [*argv, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
