"""Valkey servers for the store suites, beside tests/conftest.py's redis-server ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisCluster, RedisServer, valkey_or_skip


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A standalone valkey-server on a free loopback port (skipped where none is installed)."""
    program = valkey_or_skip()
    server = RedisServer(tmp_path_factory.mktemp("valkey"), program=program).start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A three-master Valkey cluster, created with redis-cli --cluster create."""
    program = valkey_or_skip()
    cluster = RedisCluster(tmp_path_factory.mktemp("valkey-cluster"), program=program).start()
    yield cluster
    cluster.stop()
