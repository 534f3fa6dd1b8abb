"""A hybrid model in real vLLM on CPU: sliding-window and full-attention layers, two KV
cache groups, vLLM's hybrid KV cache manager on, StoreConnector loading and saving both.

The model alternates a sliding-window layer (256 tokens, two 128-token blocks) and a
full-attention layer. Every load must give the log-probabilities of a run without
connector (float32: within 1e-3; a wrong or missing window block moves them far more).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvmux import codec
from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import build_random_hybrid
from tests.integration.conftest import (
    BASE_ENGINE,
    ENGINE_ENV,
    generate,
    make_prompt,
    results,
    store_kv,
)
from tests.support.engine_log import unexpected_tracebacks

pytestmark = pytest.mark.vllm

BLOCK = 128  # the CPU backend's block size
WINDOW = 2 * BLOCK
LONG = make_prompt(50, 10 * BLOCK + 1)  # 10 full blocks below its last token
BRANCH = LONG[: 6 * BLOCK] + make_prompt(51, 3 * BLOCK + 1)  # shares 6 blocks with LONG
SHORT = make_prompt(52, 2 * BLOCK + 1)  # a hit on it needs all 4 entries: 2 blocks x 2 groups
LOGPROB_TOLERANCE = 1e-3
# Fails at start if anything (e.g. a connector without SupportsHMA) turns the hybrid
# KV cache manager off, instead of running with one group.
HYBRID_ENGINE = {**BASE_ENGINE, "disable_hybrid_kv_cache_manager": False}
RESET = {"op": "reset_prefix_cache"}  # only the connector can supply tokens afterwards

Run = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def run_hybrid(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Run a scripted engine on a tiny random-weight hybrid model in its own process."""
    model = str(build_random_hybrid(tmp_path_factory.mktemp("model") / "hybrid", window=WINDOW))

    def run(steps: list[dict[str, Any]], kv: dict[str, Any] | None = None) -> dict[str, Any]:
        job = {"model": model, "engine": HYBRID_ENGINE, "kv": kv, "steps": steps}
        return run_engine_job(job, env=ENGINE_ENV)

    return run


@pytest.fixture(scope="module")
def reference(run_hybrid: Run) -> dict[str, Any]:
    """Tokens and log-probabilities of LONG, BRANCH and SHORT without any connector."""
    return results(run_hybrid([generate(LONG, BRANCH, SHORT, logprobs=True)]))[0]


def assert_same_logprobs(step: dict[str, Any], reference: dict[str, Any], index: int) -> None:
    assert step["tokens"][0] == reference["tokens"][index]
    got, want = step["logprobs"][0], reference["logprobs"][index]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_TOLERANCE


def entry_layers(folder: Path) -> list[int]:
    """The number of layers in each entry of a disk tier."""
    counts = []
    for path in folder.glob("??/*.kvx"):
        data = path.read_bytes()
        header_len = int.from_bytes(data[8:12], "little")
        header = json.loads(data[12 : 12 + header_len])
        entry = codec.decode(data, bytes.fromhex(header["ns"]), bytes.fromhex(header["key"]))
        counts.append(len(entry.layers))
    return counts


def test_memory_tier_serves_both_groups_after_a_prefix_cache_reset(
    run_hybrid: Run, reference: dict[str, Any]
) -> None:
    """The full-attention group loads every block of a hit, the sliding-window group the
    two blocks of its window; the outputs are those of a run without connector."""
    steps = [generate(LONG, logprobs=True), RESET, generate(LONG, logprobs=True), RESET]
    steps.append(generate(BRANCH, logprobs=True))
    run = run_hybrid(steps, kv=store_kv({"type": "memory", "capacity": "64MiB"}))
    cold, warm, branch = results(run)
    assert cold["num_cached_tokens"] == [0]
    assert warm["num_cached_tokens"] == [10 * BLOCK]
    assert branch["num_cached_tokens"] == [6 * BLOCK]
    assert_same_logprobs(cold, reference, 0)
    assert_same_logprobs(warm, reference, 0)
    assert_same_logprobs(branch, reference, 1)
    stats = run["stats"]["memory"]
    assert stats["saved_blocks"] == 2 * (10 + 3)  # every block of both prompts, per group
    assert stats["loaded_blocks"] == (10 + 2) + (6 + 2)  # the window: 2 blocks of each hit
    assert stats["load_errors"] == 0


def test_disk_tier_serves_both_groups_after_a_restart(
    run_hybrid: Run, reference: dict[str, Any], tmp_path: Path
) -> None:
    """Entries written by one engine are loaded by the next one, group by group."""
    tier = {"type": "disk", "path": str(tmp_path / "disk"), "capacity": "256MiB"}
    run_hybrid([generate(LONG)], kv=store_kv(tier))
    assert entry_layers(tmp_path / "disk") == [1] * 20  # 10 blocks x 2 groups of 1 layer
    steps = [generate(LONG, logprobs=True), RESET, generate(BRANCH, logprobs=True)]
    run = run_hybrid(steps, kv=store_kv(tier))
    warm, branch = results(run)
    assert warm["num_cached_tokens"] == [10 * BLOCK]
    assert branch["num_cached_tokens"] == [6 * BLOCK]
    assert_same_logprobs(warm, reference, 0)
    assert_same_logprobs(branch, reference, 1)
    assert run["stats"]["disk"]["load_errors"] == 0


def test_a_corrupt_entry_is_recomputed_without_stopping_the_engine(
    run_hybrid: Run, reference: dict[str, Any], tmp_path: Path
) -> None:
    """vLLM stops on block-level load errors from a model with several KV cache groups:
    every load is asynchronous and a failed one is reported per request (the request is
    computed again). One of SHORT's four entries is corrupted on disk: SHORT's output
    stays exact, the corrupt entry is dropped and saved again, and the next hit is whole."""
    tier = {"type": "disk", "path": str(tmp_path / "disk"), "capacity": "256MiB"}
    steps = [
        generate(SHORT),
        {"op": "sleep", "seconds": 0.5},  # the writer thread stores the four entries
        {"op": "corrupt", "path": tier["path"], "count": 1},
        RESET,
        generate(SHORT, logprobs=True),
        {"op": "sleep", "seconds": 0.5},
        RESET,
        generate(SHORT, logprobs=True),
    ]
    run = run_hybrid(steps, kv=store_kv(tier))
    assert results(run, "corrupt")[0]["corrupted"]
    cold, failed, again = results(run)
    assert cold["num_cached_tokens"] == [0]
    assert failed["num_cached_tokens"][0] in (0, BLOCK)  # what loaded below the bad entry
    assert again["num_cached_tokens"] == [2 * BLOCK]
    assert_same_logprobs(failed, reference, 2)
    assert_same_logprobs(again, reference, 2)
    stats = run["stats"]["disk"]
    assert stats["load_errors"] == 1
    assert unexpected_tracebacks(run["log"]) == []


def test_mux_fails_the_request_not_its_blocks_when_a_child_loads_a_corrupt_entry(
    run_hybrid: Run, reference: dict[str, Any], tmp_path: Path
) -> None:
    """MuxConnector over two disk tiers on the hybrid model: a corrupt entry in the first
    fails the request (block ids would stop vLLM 0.32); its output stays exact, it is
    served again below the failure (or by the second tier), and the next hit is whole."""
    a = {"type": "disk", "name": "a", "path": str(tmp_path / "a"), "capacity": "256MiB"}
    b = {"type": "disk", "name": "b", "path": str(tmp_path / "b"), "capacity": "256MiB"}
    kv = {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "first", "tiers": [a, b]},
    }
    steps = [
        generate(SHORT),
        {"op": "sleep", "seconds": 0.5},  # the writer threads store the entries
        {"op": "corrupt", "path": a["path"], "count": 1},
        RESET,
        generate(SHORT, logprobs=True),
        {"op": "sleep", "seconds": 0.5},
        RESET,
        generate(SHORT, logprobs=True),
    ]
    run = run_hybrid(steps, kv=kv)
    assert results(run, "corrupt")[0]["corrupted"]
    cold, failed, again = results(run)
    assert cold["num_cached_tokens"] == [0]
    assert again["num_cached_tokens"] == [2 * BLOCK]
    assert_same_logprobs(failed, reference, 2)
    assert_same_logprobs(again, reference, 2)
    assert run["stats"]["a"]["load_errors"] == 1
    assert run["stats"]["b"]["load_errors"] == 0
    for label, counters in run["mux"].items():
        assert counters.get("errors", 0) == 0, label
    assert unexpected_tracebacks(run["log"]) == []
