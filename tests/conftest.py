"""Session-wide fixtures: real redis-server and valkey-server processes started by the tests
themselves (Valkey ones skipped where none is installed, failing under CI)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisCluster, RedisServer, valkey_or_skip


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A standalone redis-server on a free loopback port."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A three-master Redis Cluster built with redis-cli --cluster create."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


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
