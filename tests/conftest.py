"""Session-wide fixtures: real redis-server processes started by the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisCluster, RedisServer


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
