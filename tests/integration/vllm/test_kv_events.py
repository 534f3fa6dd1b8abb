"""KV cache events of kvmux tiers inside a real vLLM engine (events enabled, no socket).

A KV-aware router matches a prompt's block hashes against what each engine announced:
every tier must announce its blocks under the hashes the GPU prefix cache announces for
the same blocks, with its own medium, and take them back on a reset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvmux.testing.engine import run_engine_job
from tests.integration.conftest import BASE_ENGINE, ENGINE_ENV, generate, make_prompt, results

pytestmark = pytest.mark.vllm

BLOCK = 128
PROMPT = make_prompt(31, 2 * BLOCK + 10)  # 2 full blocks
OTHER = make_prompt(32, BLOCK + 10)


def hashes(
    events: list[dict[str, Any]], kind: str, medium: str, tier: str | None = None
) -> list[str]:
    """Every hash of the events of this kind and medium (and tier), in order."""
    return [
        h
        for e in events
        if e["type"] == kind and e["medium"] == medium and (tier is None or e["ownership"] == tier)
        for h in e["hashes"]
    ]


def test_tiers_announce_the_gpu_caches_hashes_and_remove_them_on_reset(
    tiny_model: str, tmp_path: Path
) -> None:
    tiers = [
        {"type": "memory", "name": "ram", "capacity": "64MiB"},
        {"type": "disk", "name": "ssd", "path": str(tmp_path / "kv"), "capacity": "1GiB"},
    ]
    kv = {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "compose", "tiers": tiers},
    }
    steps = [
        generate(PROMPT, max_tokens=2),
        {"op": "events"},
        {"op": "reset_prefix_cache", "reset_connector": True},
        generate(OTHER, max_tokens=2),  # a step publishes what the reset queued
        {"op": "events"},
    ]
    job = {"model": tiny_model, "engine": BASE_ENGINE, "kv": kv, "steps": steps}
    run = run_engine_job({**job, "kv_events": True}, env=ENGINE_ENV)
    first, after_reset = (s["events"] for s in results(run, "events"))

    gpu = hashes(first, "BlockStored", "GPU")[:2]
    assert len(gpu) == 2
    assert hashes(first, "BlockStored", "CPU", "ram") == gpu
    assert hashes(first, "BlockStored", "STORAGE", "ssd") == gpu
    (stored,) = [e for e in first if e["medium"] == "CPU"]
    assert stored["token_ids"] == PROMPT[: 2 * BLOCK] and stored["parent"] is None

    assert sorted(hashes(after_reset, "BlockRemoved", "CPU", "ram")) == sorted(gpu)
    assert sorted(hashes(after_reset, "BlockRemoved", "STORAGE", "ssd")) == sorted(gpu)
    assert len(hashes(after_reset, "BlockStored", "CPU", "ram")) == 1  # OTHER's block
