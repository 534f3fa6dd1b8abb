"""Hits are reported to vLLM by their tier (``CacheHitSource``), so its
``prompt_tokens_by_source`` splits them: memory as host, disk as disk, Redis as external."""

from __future__ import annotations

from pathlib import Path

from vllm.v1.metrics.cache_hit_source import CacheHitSource

from tests.unit.vllm.test_store_connector import BLOCK, fake_request, scheduler


def test_each_tier_reports_its_hits_as_its_source(tmp_path: Path) -> None:
    tiers = {
        CacheHitSource.HOST: {"type": "memory", "capacity": "1MiB"},
        CacheHitSource.DISK: {"type": "disk", "path": str(tmp_path), "capacity": "1MiB"},
    }
    request = fake_request("r", 5 * BLOCK)
    for source, store in tiers.items():
        connector = scheduler(store)
        assert connector.get_external_cache_hit_sources(request, 3 * BLOCK) == {  # type: ignore[arg-type]
            source: 3 * BLOCK
        }
        assert connector.get_external_cache_hit_sources(request, 0) == {}  # type: ignore[arg-type]
        connector.shutdown()
