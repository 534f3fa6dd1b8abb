"""MuxConnector inside real vLLM engines: policies, compose, promotion, peers, failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import generate, make_prompt, results

pytestmark = pytest.mark.vllm

BLOCK = 128
HEAD = make_prompt(11, 700)  # 5 full blocks below the last token
LONGER = make_prompt(12, 1300, prefix=HEAD)  # HEAD's blocks, then 5 more


def mux(policy: str, tiers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """KVTransferConfig fields of a MuxConnector."""
    return {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": policy, "tiers": tiers, **extra},
    }


def mux_kv(policy: str, disk: Path) -> dict[str, Any]:
    """MuxConnector over a small memory tier and a disk tier."""
    tiers = [
        {"type": "memory", "capacity": "64MiB"},
        {"type": "disk", "path": str(disk), "capacity": "1GiB"},
    ]
    return mux(policy, tiers)


def hits(step: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    """Tokens each tier supplied in this step."""
    return {
        tier: int(stats["hit_tokens"] - before.get(tier, {}).get("hit_tokens", 0))
        for tier, stats in step["stats"].items()
    }


@pytest.fixture(scope="module")
def baseline(run_job: Callable[..., dict[str, Any]]) -> dict[str, list[int]]:
    run = run_job([generate(HEAD, LONGER)], enable_prefix_caching=False)
    head, longer = results(run)[0]["tokens"]
    return {"head": head, "longer": longer}


def two_engines(run_job, policy: str, disk: Path) -> dict[str, Any]:
    """Engine 1 computes LONGER (both tiers get it); engine 2 starts with an empty memory
    tier, computes HEAD (memory gets HEAD's blocks from disk), then asks for LONGER."""
    kv = mux_kv(policy, disk)
    run_job([generate(LONGER)], kv=kv, enable_prefix_caching=False)
    return run_job(
        [generate(HEAD), generate(LONGER), generate(LONGER)], kv=kv, enable_prefix_caching=False
    )


@pytest.fixture(scope="module")
def policy_runs(run_job, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {
        policy: two_engines(run_job, policy, tmp_path_factory.mktemp(policy) / "disk")
        for policy in ("first", "longest", "compose")
    }


def test_compose_loads_prefix_from_memory_and_continuation_from_disk(policy_runs, baseline) -> None:
    head, longer, again = results(policy_runs["compose"])
    assert head["tokens"] == [baseline["head"]]
    assert head["num_cached_tokens"] == [5 * BLOCK]  # from disk; memory was empty
    assert hits(longer, head["stats"]) == {"memory": 5 * BLOCK, "disk": 5 * BLOCK}
    assert longer["num_cached_tokens"] == [10 * BLOCK]
    assert longer["tokens"] == again["tokens"] == [baseline["longer"]]


def test_compose_supplies_more_than_first(policy_runs, baseline) -> None:
    first = results(policy_runs["first"])[1]
    compose = results(policy_runs["compose"])[1]
    assert first["num_cached_tokens"] == [5 * BLOCK]  # memory answers first with HEAD only
    assert compose["num_cached_tokens"] == [10 * BLOCK]
    assert first["tokens"] == compose["tokens"] == [baseline["longer"]]
    print(
        "cached tokens, first vs compose:", first["num_cached_tokens"], compose["num_cached_tokens"]
    )


def test_longest_picks_the_child_with_most_tokens(policy_runs, baseline) -> None:
    head, longer, _ = results(policy_runs["longest"])
    assert hits(longer, head["stats"]) == {"memory": 0, "disk": 10 * BLOCK}
    assert longer["tokens"] == [baseline["longer"]]


def test_promotion_from_disk_to_memory(policy_runs) -> None:
    _, longer, again = results(policy_runs["compose"])
    # LONGER's tail came from disk in the second request; memory saved it, so the third
    # request is served from memory alone
    assert hits(again, longer["stats"]) == {"memory": 10 * BLOCK, "disk": 0}
    assert again["stats"]["memory"]["saved_blocks"] >= 10


def test_mux_with_vllms_example_connector(run_job, tmp_path: Path, baseline) -> None:
    example = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "example")},
    }
    kv = mux("compose", [{"type": "memory", "capacity": "64MiB"}], connectors=[example])
    # ExampleConnector crashes on chunked prefill: one chunk holds the whole prompt here
    run = run_job(
        [generate(HEAD), generate(HEAD), {"op": "reset_prefix_cache"}],
        kv=kv,
        enable_prefix_caching=False,
        max_num_batched_tokens=1024,
    )
    cold, warm = results(run)
    assert cold["tokens"] == warm["tokens"] == [baseline["head"]]
    assert warm["num_cached_tokens"] == [5 * BLOCK]
    assert (tmp_path / "example").exists()


def test_failing_child_never_takes_the_engine_down(run_job, tmp_path: Path, baseline) -> None:
    failing = {
        "kv_connector": "FailingWorkerConnector",
        "kv_connector_module_path": "tests.integration.failing_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "store": {"type": "memory", "capacity": "64MiB", "name": "failing"}
        },
    }
    healthy = [{"type": "memory", "capacity": "64MiB", "name": "healthy"}]
    kv = mux("compose", healthy, connectors=[failing], breaker_seconds=0.5)
    steps = [generate(HEAD), generate(HEAD), generate(LONGER), generate(LONGER), generate(HEAD)]
    run = run_job(steps, kv=kv, enable_prefix_caching=False)
    outs = results(run)
    assert [o["tokens"] for o in outs] == [
        [baseline["head"]],
        [baseline["head"]],
        [baseline["longer"]],
        [baseline["longer"]],
        [baseline["head"]],
    ]
    assert "failed in start_load_kv" in run["log"] or "failed in wait_for_save" in run["log"]
    assert run["stats"]["healthy"]["loaded_blocks"] > 0
    failing_worker = run["mux"]["WORKER/1:FailingWorkerConnector"]
    assert failing_worker["errors"] >= 1
    assert failing_worker["breaker_trips"] >= 1
    assert run["mux"]["WORKER/0:healthy"].get("errors", 0) == 0
    print("failing-child run:", [o["num_cached_tokens"] for o in outs], run["mux"])
