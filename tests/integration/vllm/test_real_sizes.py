"""A long prompt of an 8B model's KV size is kept whole with default settings.

The model has Llama 3.1 8B's KV bytes per token (256 KiB in float32: 32 MiB a block of
128 tokens), in 4 layers. One 2,049-token prompt's KV (512 MiB) is twice the fixed save
queue kvmux had (256 MiB, which kept 1,024 of its 2,048 tokens); the default queue now
follows the engine's batch. One engine stores through MuxConnector over a memory tier
smaller than the prompt, a disk tier and a Redis tier, all with default settings; fresh
engines then load every full block from the disk tier alone, from the Redis tier alone,
and from the disk under a fresh memory + disk MuxConnector, with the log-probabilities of
a run without connector.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import build_random_llama
from tests.integration.conftest import ENGINE_ENV, generate, make_prompt, results, store_kv
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.vllm

BLOCK = 128  # the CPU backend's block size
PROMPT = make_prompt(81, 16 * BLOCK + 1)  # 16 full blocks: 512 MiB of KV
FULL_BLOCKS_TOKENS = 16 * BLOCK
LOGPROB_TOLERANCE = 1e-3  # float32: exact loads move log-probabilities by about 1e-6
ENGINE = {"dtype": "float32", "block_size": BLOCK, "enable_prefix_caching": False}
ENV = {**ENGINE_ENV, "VLLM_CPU_KVCACHE_SPACE": "2"}  # 64 blocks of 32 MiB


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_random_llama(tmp_path_factory.mktemp("model") / "kv8b", "llama-8b-kv"))


SETTLE = {"op": "sleep", "seconds": 10.0}  # the writer threads store what was saved


def run(model: str, kv: dict[str, Any] | None, settle: bool = False) -> dict[str, Any]:
    """One engine (the engine's own batch defaults), the prompt once, with its stats
    (after the saves are written, with ``settle``)."""
    steps = [generate(PROMPT, max_tokens=4, logprobs=True), *([SETTLE] if settle else [])]
    steps.append({"op": "stats"})
    job = {"model": model, "engine": ENGINE, "kv": kv, "steps": steps}
    return run_engine_job(job, env=ENV)


def mux(*tiers: dict[str, Any]) -> dict[str, Any]:
    config = {"policy": "compose", "tiers": list(tiers)}
    return {**store_kv({}), "kv_connector": "MuxConnector", "kv_connector_extra_config": config}


def memory() -> dict[str, Any]:
    return {"type": "memory", "capacity": "256MiB"}  # half the prompt


def disk(path: Path) -> dict[str, Any]:
    return {"type": "disk", "path": str(path), "capacity": "2GiB"}


def redis(url: str) -> dict[str, Any]:
    return {"type": "redis", "url": url}


@pytest.fixture(scope="module")
def reference(model: str) -> dict[str, Any]:
    return results(run(model, None))[0]


@pytest.fixture(scope="module")
def stored(model: str, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer):
    """The writer's run, its disk folder and the Redis URL."""
    folder = tmp_path_factory.mktemp("tiers") / "disk"
    writer = run(model, mux(memory(), disk(folder), redis(redis_server.url)), settle=True)
    return writer, folder, redis_server.url


def assert_exact(step: dict[str, Any], reference: dict[str, Any]) -> None:
    assert step["tokens"] == reference["tokens"]
    got, want = step["logprobs"][0], reference["logprobs"][0]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_TOLERANCE


def test_the_writer_saves_every_full_block_to_every_tier(stored, reference) -> None:
    writer, _, _ = stored
    assert_exact(results(writer)[0], reference)
    stats = results(writer, "stats")[0]["stats"]
    for tier in ("disk", "redis"):
        assert stats[tier]["dropped_saves"] == 0, stats[tier]
        assert stats[tier]["saved_blocks"] == 16
    assert "save queue: " in writer["log"]


@pytest.mark.parametrize("reader", ["disk", "redis", "memory+disk"])
def test_a_fresh_engine_reuses_every_full_block(model, stored, reference, reader) -> None:
    _, folder, url = stored
    kv = {
        "disk": store_kv(disk(folder)),
        "redis": store_kv(redis(url)),
        "memory+disk": mux(memory(), disk(folder)),
    }[reader]
    step = results(run(model, kv))[0]
    assert step["num_cached_tokens"] == [FULL_BLOCKS_TOKENS]
    assert_exact(step, reference)
