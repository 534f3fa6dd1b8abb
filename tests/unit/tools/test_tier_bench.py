"""``kvmux bench tier``: a tier's put and get beside its raw limit, leaving its entries alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvmux.cli import main
from kvmux.config import DiskSpec, MemorySpec, RedisSpec
from kvmux.errors import ConfigError, StoreUnavailable
from kvmux.tools.tier_bench import WARM_DISK, Entries, HostLayers, bench_tier, format_rows
from tests.support.redis_server import RedisServer

ENTRY = 64 * 1024


def _check_rows(rows: list[dict[str, Any]], expected: list[tuple[str, str]]) -> None:
    assert [(r["tier"], r["op"]) for r in rows] == expected
    for row in rows:
        assert row["kvmux_gbps"] > 0 and row["limit_gbps"] > 0 and row["ratio"] > 0


def test_a_disk_run_works_beside_the_tiers_entries_and_removes_its_own(tmp_path: Path) -> None:
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "entry.kvx").write_bytes(b"theirs")
    result = bench_tier(DiskSpec(tmp_path, 2**30), 3, ENTRY)
    _check_rows(result["rows"], [("disk", "put"), ("disk", "get"), (WARM_DISK, "get")])
    assert result["config"]["entry_bytes"] == ENTRY
    assert result["disk_page_cache"]["reads"] in ("evicted", "not evicted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ab"]  # its own directory is gone
    assert (tmp_path / "ab" / "entry.kvx").read_bytes() == b"theirs"


def test_a_redis_run_keeps_to_its_own_keys(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        client.set("kvmux:theirs", b"x")
        before = set(client.scan_iter("*"))  # the session's server may hold other tests' keys
        result = bench_tier(RedisSpec(url=redis_server.url, socket_timeout=10.0), 3, ENTRY)
        _check_rows(result["rows"], [("redis", "put"), ("redis", "get")])
        assert result["redis"]["batch"] == 8 and result["redis"]["version"]
        assert set(client.scan_iter("*")) == before  # its own keys gone, all others kept
        assert client.get("kvmux:theirs") == b"x"
    finally:
        client.delete("kvmux:theirs")
        client.close()


def test_loads_verify_and_copy_every_entry() -> None:
    layers = HostLayers(2, ENTRY)
    entries = Entries(2, ENTRY, layers)
    for i in range(2):
        entries.load(i, entries.values[i])
    assert layers.dest == layers.source
    with pytest.raises(RuntimeError, match="missing"):
        entries.load(0, None)


@pytest.mark.parametrize(("count", "size", "key"), [(0, ENTRY, "entries"), (2, 100, "entry_size")])
def test_sizes_that_cannot_be_cut_into_layers_are_refused(count: int, size: int, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        Entries(count, size)


def test_a_memory_tier_or_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="memory tier lives in its engine"):
        bench_tier(MemorySpec(2**20), 1, ENTRY)
    with pytest.raises(StoreUnavailable, match="no such directory"):
        bench_tier(DiskSpec(tmp_path / "none", 2**30), 1, ENTRY)


def test_the_command_prints_a_table_or_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "tier", "--disk", str(tmp_path), "--entries", "2", "--entry-size", "64KiB"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "kvmux/limit" in table and "sequential write" in table
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["entries"] == 2
    assert format_rows(result["rows"]).splitlines()[0].startswith("tier")
    assert main(["bench", "tier", "--disk", str(tmp_path / "none")]) == 1
    assert "no such directory" in capsys.readouterr().err
