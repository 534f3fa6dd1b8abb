"""Tensor parallelism (TP=2 on vLLM's CPU build): a shard missing on one rank only.

The scheduler looks a block up on rank 0; rank 1's shard of it may be gone (evicted,
deleted by a writer of the tier). The forward pass then computes over a failed shard and
its all-reduce spreads the error to every rank, so every rank must treat the block as
failed: neither may save what was computed over it. The oracle: after the failed load,
the whole prompt loads with the log-probabilities of a TP=2 run without connector.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvmux.keys import block_keys, generation_namespace, store_key
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
MISSING_BLOCK = 4  # rank 1's shard of it is deleted
LOGPROB_TOLERANCE = 1e-3
TP_ENV = {
    **ENGINE_ENV,
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",  # one core per rank
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "OMP_NUM_THREADS": "1",
}
ENGINE = {**BASE_ENGINE, "enable_prefix_caching": False, "tensor_parallel_size": 2}
SETTLE = {"op": "sleep", "seconds": 1.0}  # the writer threads store what was saved


def _run(model: str, kv: dict[str, Any] | None, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return run_scripted_job(model, ENGINE, kv, steps, TP_ENV)


def _shard_path(folder: Path, namespace: str, block: int, rank: int) -> Path:
    generation = decode_record((folder / "generation").read_bytes(), None)
    assert generation is not None
    root = generation_namespace(bytes.fromhex(namespace), generation)
    key = store_key(block_keys(root, HEAD, BLOCK)[block], rank).hex()
    return folder / key[:2] / f"{key}.kvx"


def test_a_shard_missing_on_one_rank_leaves_no_wrong_block_in_the_tier(
    tiny_model: str, tmp_path: Path
) -> None:
    folder = tmp_path / "disk"
    kv = store_kv(
        {"type": "disk", "path": str(folder), "capacity": "256MiB", "async_loads": "never"}
    )
    first = _run(tiny_model, kv, [generate(HEAD), SETTLE, {"op": "namespace"}])
    namespace = results(first, "namespace")[0]["namespace"]
    for rank in (0, 1):
        assert _shard_path(folder, namespace, MISSING_BLOCK, rank).is_file()
    _shard_path(folder, namespace, MISSING_BLOCK, 1).unlink()
    steps = [generate(LONG, logprobs=True), SETTLE, generate(LONG, logprobs=True)]
    second = _run(tiny_model, kv, steps)
    failed, again = results(second)
    assert failed["num_cached_tokens"] == [9 * BLOCK]  # as looked up: rank 0 held them all
    assert again["num_cached_tokens"] == [13 * BLOCK]  # everything, from the tier
    reference = results(_run(tiny_model, None, [generate(LONG, logprobs=True)]))[0]
    for step in (failed, again):
        assert step["tokens"] == reference["tokens"]
        got, want = step["logprobs"][0], reference["logprobs"][0]
        worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
        assert worst < LOGPROB_TOLERANCE, f"{step is again}: log-probabilities moved by {worst:.2e}"
