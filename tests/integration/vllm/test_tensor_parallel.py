"""Tensor parallelism (TP=2 on vLLM's CPU build): one cache for every TP size, and a
shard that fails on one rank only.

Entries are per KV head (``kvmux.tier.shards``): a TP=1 engine and a TP=2 engine on one
disk or Redis tier load what the other stored. The oracle is the log-probabilities of a
run without connector at the loading engine's own TP size (the all-reduce changes the
last bits between sizes, so KV computed at one size differs from the other's in them).

A shard may be present and fail to verify on one rank only (a writer of the tier wrote
over it). The forward pass then computes over a failed shard and its all-reduce spreads
the error to every rank, so every rank must treat the block as failed: neither may save
what was computed over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvmux.keys import block_keys, generation_namespace, store_key
from kvmux.testing.models import build_random_llama
from kvmux.tier.scheduler.generation import decode_record
from tests.integration.conftest import (
    BASE_ENGINE,
    ENGINE_ENV,
    generate,
    make_prompt,
    results,
    store_kv,
)
from tests.support.weight_update_engine import run_scripted_job

pytestmark = pytest.mark.vllm

BLOCK = 128
HEAD = make_prompt(60, 9 * BLOCK + 1)  # 9 full blocks below its last token
LONG = make_prompt(61, 13 * BLOCK + 1, prefix=HEAD[: 9 * BLOCK])  # HEAD's blocks, 4 more
MISSING_BLOCK = 4  # rank 1's shard of it (head 1 of the 2) is overwritten
LOGPROB_TOLERANCE = 1e-3
TP_ENV = {
    **ENGINE_ENV,
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",  # one core per rank
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "OMP_NUM_THREADS": "1",
}
ENGINE = {**BASE_ENGINE, "enable_prefix_caching": False, "tensor_parallel_size": 2}
SETTLE = {"op": "sleep", "seconds": 1.0}  # the writer threads store what was saved


TP1_ENGINE = {**ENGINE, "tensor_parallel_size": 1}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Llama with 2 KV heads: one per rank at TP=2, two shards per block."""
    return str(build_random_llama(tmp_path_factory.mktemp("model") / "tiny-gqa", "tiny-gqa"))


def _run(
    model: str, kv: dict[str, Any] | None, steps: list[dict[str, Any]], tp: int = 2
) -> dict[str, Any]:
    if tp == 1:
        return run_scripted_job(model, TP1_ENGINE, kv, steps, ENGINE_ENV)
    return run_scripted_job(model, ENGINE, kv, steps, TP_ENV)


def _shard_path(folder: Path, namespace: str, block: int, shard: int) -> Path:
    generation = decode_record((folder / "generation").read_bytes(), None)
    assert generation is not None
    root = generation_namespace(bytes.fromhex(namespace), generation)
    key = store_key(block_keys(root, HEAD, BLOCK)[block], shard).hex()
    return folder / key[:2] / f"{key}.kvx"


def test_a_shard_failing_on_one_rank_leaves_no_wrong_block_in_the_tier(
    tiny_model: str, tmp_path: Path, reference_tp2: dict[str, Any]
) -> None:
    folder = tmp_path / "disk"
    kv = store_kv(
        {"type": "disk", "path": str(folder), "capacity": "256MiB", "async_loads": "never"}
    )
    first = _run(tiny_model, kv, [generate(HEAD), SETTLE, {"op": "namespace"}])
    namespace = results(first, "namespace")[0]["namespace"]
    for shard in (0, 1):
        assert _shard_path(folder, namespace, MISSING_BLOCK, shard).is_file()
    victim = _shard_path(folder, namespace, MISSING_BLOCK, 1)
    victim.write_bytes(b"written over by a writer of the tier" * 64)
    steps = [generate(LONG, logprobs=True), SETTLE, generate(LONG, logprobs=True)]
    second = _run(tiny_model, kv, steps)
    failed, again = results(second)
    assert failed["num_cached_tokens"] == [9 * BLOCK]  # as looked up: every shard was there
    assert again["num_cached_tokens"] == [13 * BLOCK]  # everything, from the tier
    for step in (failed, again):
        _assert_exact(step, reference_tp2)


@pytest.fixture(scope="module")
def reference_tp2(tiny_model: str) -> dict[str, Any]:
    """LONG's tokens and log-probabilities at TP=2, without connector."""
    return results(_run(tiny_model, None, [generate(LONG, logprobs=True)]))[0]


@pytest.fixture(scope="module")
def reference_tp1(tiny_model: str) -> dict[str, Any]:
    """LONG's tokens and log-probabilities at TP=1, without connector."""
    return results(_run(tiny_model, None, [generate(LONG, logprobs=True)], tp=1))[0]


def _assert_exact(step: dict[str, Any], reference: dict[str, Any]) -> float:
    """The step's tokens are the reference's, its log-probabilities within the tolerance."""
    assert step["tokens"] == reference["tokens"]
    got, want = step["logprobs"][0], reference["logprobs"][0]
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst < LOGPROB_TOLERANCE, f"log-probabilities moved by {worst:.2e}"
    return worst


def _tier(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "disk":
        store = {"type": "disk", "path": str(tmp_path / "disk"), "capacity": "256MiB"}
    else:
        url = request.getfixturevalue("redis_server").url
        store = {"type": "redis", "url": url, "key_prefix": f"tp-mix-{tmp_path.name}:"}
    return store_kv({**store, "async_loads": "never"})


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_tp1_and_tp2_engines_share_one_tier(
    kind: str,
    tiny_model: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    reference_tp1: dict[str, Any],
    reference_tp2: dict[str, Any],
) -> None:
    """TP=1 stores HEAD; TP=2 loads it and stores LONG's rest; TP=1 loads all of LONG."""
    kv = _tier(kind, tmp_path, request)
    first = _run(tiny_model, kv, [generate(HEAD), SETTLE, {"op": "stats"}], tp=1)
    assert results(first, "stats")[0]["stats"][kind]["saved_blocks"] == 9
    steps = [generate(LONG, logprobs=True), SETTLE, {"op": "stats"}]
    second = _run(tiny_model, kv, steps)
    loaded = results(second)[0]
    assert loaded["num_cached_tokens"] == [9 * BLOCK]  # TP=1's entries
    tp2_worst = _assert_exact(loaded, reference_tp2)
    third = _run(tiny_model, kv, [generate(LONG, logprobs=True)], tp=1)
    back = results(third)[0]
    assert back["num_cached_tokens"] == [13 * BLOCK]  # 9 blocks of TP=1's, 4 of TP=2's
    tp1_worst = _assert_exact(back, reference_tp1)
    print(f"{kind}: TP=2 over TP=1's entries {tp2_worst:.1e}, TP=1 over both {tp1_worst:.1e}")


def test_mux_over_memory_and_disk_at_tp2_after_a_reset_and_a_restart(
    tiny_model: str, tmp_path: Path, reference_tp2: dict[str, Any]
) -> None:
    """A memory hit after a prefix-cache reset, a disk hit after a restart, both exact."""
    tiers = [
        {"type": "memory", "capacity": "64MiB"},
        {"type": "disk", "path": str(tmp_path / "disk"), "capacity": "256MiB"},
    ]
    kv = {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "first", "tiers": tiers},
    }
    steps = [
        generate(LONG),
        SETTLE,
        {"op": "reset_prefix_cache"},
        generate(LONG, logprobs=True),
        {"op": "stats"},
    ]
    first = _run(tiny_model, kv, steps)
    from_memory = results(first)[1]
    assert from_memory["num_cached_tokens"] == [13 * BLOCK]
    assert results(first, "stats")[0]["stats"]["memory"]["hit_tokens"] == 13 * BLOCK
    _assert_exact(from_memory, reference_tp2)
    second = _run(tiny_model, kv, [generate(LONG, logprobs=True), {"op": "stats"}])
    from_disk = results(second)[0]
    assert from_disk["num_cached_tokens"] == [13 * BLOCK]
    assert results(second, "stats")[0]["stats"]["disk"]["hit_tokens"] == 13 * BLOCK
    _assert_exact(from_disk, reference_tp2)
