"""The Redis tier inside real vLLM engines: sharing (on Redis and Valkey), namespaces, a server
that dies, limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import build_random_llama
from tests.integration.conftest import (
    BASE_ENGINE,
    ENGINE_ENV,
    generate,
    make_prompt,
    results,
    store_kv,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.vllm

BLOCK = 128
PROMPTS = [make_prompt(500 + i, 900) for i in range(3)]
HITS = (900 - 1) // BLOCK * BLOCK  # 7 blocks
LOGPROB_TOLERANCE = 1e-3  # float32: exact loads move log-probabilities by about 1e-6


def redis_kv(url: str, **store: Any) -> dict[str, Any]:
    spec = {"type": "redis", "url": url, "breaker_seconds": 0.3, **store}
    return store_kv(spec)


@pytest.fixture(scope="module")
def reference(run_job: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Tokens and log-probabilities of every prompt, without connector."""
    return results(run_job([generate(*PROMPTS, logprobs=True)], enable_prefix_caching=False))[0]


@pytest.fixture(scope="module")
def baseline(reference: dict[str, Any]) -> list[list[int]]:
    tokens: list[list[int]] = reference["tokens"]
    return tokens


def engine_on(run_job: Callable[..., dict[str, Any]], url: str) -> dict[str, Any]:
    """One engine run of every prompt with the Redis tier at ``url``."""
    return run_job([generate(*PROMPTS)], kv=redis_kv(url), enable_prefix_caching=False)


@pytest.fixture(scope="module")
def first_engine(run_job, redis_server) -> dict[str, Any]:
    return engine_on(run_job, redis_server.url)


@pytest.mark.parametrize("server", ["redis", "valkey"])
def test_second_engine_hits_what_the_first_computed(server, request, run_job, baseline):
    if server == "redis":  # the module's first engine, which the other tests share
        url = request.getfixturevalue("redis_server").url
        first = request.getfixturevalue("first_engine")
    else:
        url = request.getfixturevalue("valkey_server").url
        first = engine_on(run_job, url)
    assert results(first)[0]["num_cached_tokens"] == [0, 0, 0]
    second = engine_on(run_job, url)
    step = results(second)[0]
    assert step["num_cached_tokens"] == [HITS] * 3
    assert step["tokens"] == baseline
    assert second["stats"]["redis"]["loaded_blocks"] == 3 * HITS // BLOCK
    print(f"cross-engine ({server}):", step["num_cached_tokens"], second["stats"]["redis"])


def test_async_loads_in_the_multi_process_layout(first_engine, run_job, redis_server, reference):
    """vLLM's default layout: Redis loads run off the forward path and stay exact."""
    kv = redis_kv(redis_server.url)
    run = run_job([generate(*PROMPTS, logprobs=True)], kv=kv, multiprocess=True)
    step = results(run)[0]
    assert step["num_cached_tokens"] == [HITS] * 3
    assert step["tokens"] == reference["tokens"]
    for got, want in zip(step["logprobs"], reference["logprobs"], strict=True):
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_TOLERANCE


def test_another_model_never_sees_these_entries(first_engine, redis_server, tmp_path: Path):
    other = build_random_llama(tmp_path / "other-model", seed=1)
    job = {
        "model": str(other),
        "engine": {**BASE_ENGINE, "enable_prefix_caching": False},
        "kv": redis_kv(redis_server.url),
        "steps": [generate(*PROMPTS)],
    }
    step = results(run_engine_job(job, env=ENGINE_ENV))[0]
    assert step["num_cached_tokens"] == [0, 0, 0]


def test_cluster_tier(run_job, redis_cluster, baseline) -> None:
    kv = redis_kv(redis_cluster.url, cluster=True, key_prefix="vllm-cluster:")
    run = run_job([generate(*PROMPTS), generate(*PROMPTS)], kv=kv, enable_prefix_caching=False)
    cold, warm = results(run)
    assert cold["tokens"] == warm["tokens"] == baseline
    assert warm["num_cached_tokens"] == [HITS] * 3
    # this test's keys only: the session's cluster may hold other test files' keys
    keys = [
        len(n.cli("--scan", "--pattern", "vllm-cluster:*").split()) for n in redis_cluster.nodes
    ]
    entries = sum(keys) - 1  # the generation record is a key too
    assert entries == 3 * (900 // BLOCK) and all(k > 0 for k in keys)  # spread over all masters
    print("cluster:", warm["num_cached_tokens"], "keys per master:", keys, run["stats"]["redis"])


def test_server_killed_and_restarted_while_serving(tiny_model, tmp_path: Path, baseline) -> None:
    server = RedisServer(tmp_path / "flaky").start()
    marks = {name: tmp_path / name for name in ("down?", "down", "up?", "up")}
    steps = [
        generate(PROMPTS[0]),
        generate(PROMPTS[0]),  # hit
        {"op": "touch", "path": str(marks["down?"])},
        {"op": "wait_file", "path": str(marks["down"])},
        generate(PROMPTS[0]),  # server dead: recomputed
        generate(PROMPTS[1]),
        {"op": "touch", "path": str(marks["up?"])},
        {"op": "wait_file", "path": str(marks["up"])},
        {"op": "sleep", "seconds": 1.5},  # past the breaker's back-off
        generate(PROMPTS[0]),  # restarted empty: recomputed, saved again
        generate(PROMPTS[0]),  # hit again
    ]
    outcome: dict[str, Any] = {}

    job = {
        "model": tiny_model,
        "engine": {**BASE_ENGINE, "enable_prefix_caching": False},
        "kv": redis_kv(server.url),
        "steps": steps,
    }
    env = {**ENGINE_ENV, "VLLM_LOGGING_STREAM": "ext://sys.stderr"}  # kvmux logs as vLLM does

    def serve() -> None:
        outcome["run"] = run_engine_job(job, env=env)

    engine = threading.Thread(target=serve)
    engine.start()
    for ask, answer, act in (("down?", "down", server.kill), ("up?", "up", server.start)):
        while not marks[ask].exists() and engine.is_alive():
            time.sleep(0.05)
        act()
        marks[answer].touch()
    engine.join()
    server.kill()
    run = outcome["run"]
    outs = results(run)
    assert [o["tokens"][0] for o in outs] == [
        baseline[0],
        baseline[0],
        baseline[0],
        baseline[1],
        baseline[0],
        baseline[0],
    ]
    assert [o["num_cached_tokens"][0] for o in outs] == [0, HITS, 0, 0, 0, HITS]
    assert run["stats"]["redis"]["store_errors"] >= 1
    assert "serving misses until it is back" in run["log"]
    assert "server reachable again" in run["log"]
    print("kill/restart:", [o["num_cached_tokens"][0] for o in outs], run["stats"]["redis"])


def test_full_server_refusing_writes(run_job, tmp_path: Path, baseline) -> None:
    server = RedisServer(
        tmp_path / "full", ["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]
    )
    server.start()
    # the refused saves reach the scheduler with the workers' output of a later step: let
    # the writer finish, then step a short unrelated prompt before asking again (with no
    # step between, a refused block may still be offered once: a counted miss)
    settle = [{"op": "sleep", "seconds": 1.0}, generate(make_prompt(999, 16))]
    run = run_job(
        [generate(*PROMPTS), *settle, generate(*PROMPTS)],
        kv=redis_kv(server.url),
        enable_prefix_caching=False,
    )
    server.kill()
    cold, _, warm = results(run)
    assert cold["tokens"] == warm["tokens"] == baseline
    stats = run["stats"]["redis"]
    assert stats["save_errors"] >= 1  # refused: noeviction
    assert stats["load_errors"] == 0
    print("maxmemory noeviction:", warm["num_cached_tokens"], stats)
