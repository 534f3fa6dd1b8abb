"""Real server processes for the tests: standalone, TLS + ACL, and a 3-master cluster.

Each starts ``redis-server`` unless given another program: ``valkey-server`` (Valkey, the
Redis fork the Redis tier also serves) runs the same configurations, except TLS.
"""

from __future__ import annotations

import datetime
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def find_program(name: str) -> str | None:
    """``name`` on PATH, else beside this Python (scripts/setup.sh puts Valkey in .venv/bin)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if os.access(beside, os.X_OK) else None)


REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"
VALKEY_SERVER = find_program("valkey-server")
VALKEY_MISSING = (
    "valkey-server is not installed: KVMUX_WITH_REDIS=1 bash scripts/setup.sh installs it "
    "into .venv/bin"
)


def valkey_or_skip() -> str:
    """The valkey-server program; skips the test without one (fails it in CI, which has one)."""
    if VALKEY_SERVER is not None:
        return VALKEY_SERVER
    if os.environ.get("CI", "").lower() in ("1", "true"):
        pytest.fail(VALKEY_MISSING)
    pytest.skip(VALKEY_MISSING)


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


def _wait_for_port(port: int, program: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{Path(program).name} did not open port {port}")


@dataclass
class TlsFiles:
    """A throwaway CA with a server and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(folder: Path) -> TlsFiles:
    """Generate a CA and two certificates signed by it (valid for a day, 127.0.0.1)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("kvmux test CA"))
        .issuer_name(name("kvmux test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(san, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    server_cert, server_key = issue("127.0.0.1")
    client_cert, client_key = issue("kvmux client")
    (folder / "server.pem").write_bytes(server_cert.public_bytes(pem))
    (folder / "client.pem").write_bytes(client_cert.public_bytes(pem))
    return TlsFiles(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=write_key(server_key, folder / "server.key"),
        client_cert=folder / "client.pem",
        client_key=write_key(client_key, folder / "client.key"),
    )


class RedisServer:
    """One redis-server (or ``program``: valkey-server) on a free loopback port, in its own dir."""

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
        """The URL kvmux connects to."""
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

    def start(self) -> RedisServer:
        """Start (or restart, empty) the server and wait until it listens."""
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.program)
        return self

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


class RedisCluster:
    """Three masters (redis-server or ``program``) joined with ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, program: str = REDIS_SERVER):
        self.nodes = [
            RedisServer(
                workdir / f"node{i}",
                ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
                program=program,
            )
            for i in range(3)
        ]

    @property
    def url(self) -> str:
        """A seed URL; the client discovers the other nodes."""
        return self.nodes[0].url

    def start(self) -> RedisCluster:
        """Start the nodes, create the cluster, wait until every slot is served."""
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                return self
            time.sleep(0.2)
        raise RuntimeError(f"{Path(self.nodes[0].program).name} cluster did not become ready")

    def stop(self) -> None:
        """Kill every node."""
        for node in self.nodes:
            node.kill()
