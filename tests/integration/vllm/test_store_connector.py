"""StoreConnector inside real vLLM engines on a tiny random Llama (float32, CPU)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import generate, make_prompt, results, store_kv
from tests.support.engine_log import unexpected_tracebacks
from tests.support.faulty_store import write_control

pytestmark = pytest.mark.vllm

BLOCK = 128  # the CPU backend's block size
SHARED = make_prompt(1, 700)
SIBLING = make_prompt(2, 700, prefix=SHARED[:400])
OTHER = make_prompt(3, 700)
LONG = make_prompt(4, 2000)  # eight chunks of 256 tokens
EVICTION_SET = [make_prompt(100 + i, 700) for i in range(8)]
PREEMPT_SET = [make_prompt(200 + i, 600) for i in range(4)]
DISK_SET = [make_prompt(300 + i, 900) for i in range(2)]
ALL_SHORT = [SHARED, SIBLING, OTHER, LONG, *EVICTION_SET, *DISK_SET]
LOGPROB_TOLERANCE = 1e-3  # float32: exact loads move log-probabilities by about 1e-6
MEMORY_CAPACITY = 4 * 2**20  # about 30 entries of the tiny model: the eviction set overflows it


def full_blocks_below_last(prompt: list[int]) -> int:
    return (len(prompt) - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def baseline_run(run_job: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Every prompt through an engine with no connector."""
    steps = [generate(*ALL_SHORT, logprobs=True), generate(*PREEMPT_SET, max_tokens=120)]
    return run_job(steps, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def baseline(baseline_run: dict[str, Any]) -> dict[tuple[int, ...], list[int]]:
    """Greedy tokens of every prompt from an engine with no connector."""
    short, preempt = results(baseline_run)
    tokens = dict(zip(map(tuple, ALL_SHORT), short["tokens"], strict=True))
    tokens.update({("preempt", *p): t for p, t in zip(PREEMPT_SET, preempt["tokens"], strict=True)})
    return tokens


@pytest.fixture(scope="module")
def baseline_logprobs(baseline_run: dict[str, Any]) -> dict[tuple[int, ...], list[float]]:
    """The log-probability of each greedy token of the short prompts, without connector."""
    short = results(baseline_run)[0]
    return dict(zip(map(tuple, ALL_SHORT), short["logprobs"], strict=True))


@pytest.fixture(scope="module")
def memory_run(run_job: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """One engine with a small memory tier and no prefix caching, through every scenario."""
    steps = [
        generate(SHARED),
        generate(SHARED),
        generate(SIBLING, OTHER),
        generate(SIBLING, OTHER),
        generate(LONG),
        generate(LONG),
        *[generate(p) for p in EVICTION_SET],
        {"op": "stats"},
        generate(SHARED),
    ]
    store = {"type": "memory", "capacity": MEMORY_CAPACITY}
    return run_job(steps, kv=store_kv(store), enable_prefix_caching=False)


def expect(baseline: dict[tuple[int, ...], list[int]], prompt: list[int]) -> list[int]:
    return baseline[tuple(prompt)]


def test_repeated_prompt_is_loaded_from_the_connector(memory_run, baseline) -> None:
    cold, warm = results(memory_run)[:2]
    assert cold["num_cached_tokens"] == [0]
    assert warm["num_cached_tokens"] == [full_blocks_below_last(SHARED)]
    assert cold["tokens"] == warm["tokens"] == [expect(baseline, SHARED)]


def test_batch_with_shared_prefix(memory_run, baseline) -> None:
    cold, warm = results(memory_run)[2:4]
    assert cold["num_cached_tokens"] == [3 * BLOCK, 0]  # SIBLING shares 400 tokens with SHARED
    assert warm["num_cached_tokens"] == [5 * BLOCK, 5 * BLOCK]
    assert warm["tokens"] == cold["tokens"] == [expect(baseline, SIBLING), expect(baseline, OTHER)]


def test_chunked_prefill_prompt(memory_run, baseline) -> None:
    cold, warm = results(memory_run)[4:6]
    assert warm["num_cached_tokens"] == [full_blocks_below_last(LONG)]
    assert cold["tokens"] == warm["tokens"] == [expect(baseline, LONG)]


def test_eviction_keeps_memory_tier_within_budget(memory_run, baseline) -> None:
    stats = results(memory_run, "stats")[0]["stats"]["memory"]
    assert 0 < stats["peak_stored_bytes"] <= MEMORY_CAPACITY
    assert stats["save_errors"] == 0
    for step, prompt in zip(results(memory_run)[6:14], EVICTION_SET, strict=True):
        assert step["tokens"] == [expect(baseline, prompt)]
    last = results(memory_run)[-1]
    assert last["num_cached_tokens"] == [0]  # SHARED was evicted long ago: recomputed
    assert last["tokens"] == [expect(baseline, SHARED)]
    assert memory_run["stats"]["memory"]["load_errors"] == 0


def test_preemption_keeps_outputs_exact(run_job, baseline) -> None:
    store = {"type": "memory", "capacity": "64MiB"}
    run = run_job(
        [generate(*PREEMPT_SET, max_tokens=120), generate(*PREEMPT_SET, max_tokens=120)],
        kv=store_kv(store),
        enable_prefix_caching=False,
        num_gpu_blocks_override=12,  # 4 requests of 6 blocks each: they preempt each other
        max_model_len=1024,
    )
    expected = [baseline[("preempt", *p)] for p in PREEMPT_SET]
    cold, warm = results(run)
    assert cold["tokens"] == expected
    assert warm["tokens"] == expected
    assert sum(warm["num_cached_tokens"]) > 0


def test_request_aborted_midway(run_job, baseline) -> None:
    store = {"type": "memory", "capacity": "64MiB"}
    abort = {"op": "abort_midway", "prompts": [LONG, OTHER], "steps_before_abort": 3}
    run = run_job(
        [abort, generate(LONG), generate(LONG)], kv=store_kv(store), enable_prefix_caching=False
    )
    aborted = results(run, "abort_midway")[0]
    assert aborted["tokens"][0] is None  # aborted during its chunked prefill
    assert aborted["tokens"][1] == expect(baseline, OTHER)
    partial, full = results(run)
    assert 0 < partial["num_cached_tokens"][0] < full_blocks_below_last(LONG)  # saved before abort
    assert full["num_cached_tokens"] == [full_blocks_below_last(LONG)]
    assert partial["tokens"] == full["tokens"] == [expect(baseline, LONG)]


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("disk-tier") / "kvmux"


@pytest.fixture(scope="module")
def first_disk_run(run_job, disk_dir: Path) -> dict[str, Any]:
    """First engine: prefix caching on, its own cache reset between the two calls."""
    store = {"type": "disk", "path": str(disk_dir), "capacity": "256MiB"}
    steps = [generate(*DISK_SET), {"op": "reset_prefix_cache"}, generate(*DISK_SET)]
    return run_job(steps, kv=store_kv(store), enable_prefix_caching=True)


def test_prefix_caching_on_with_reset(first_disk_run, baseline) -> None:
    cold, warm = results(first_disk_run)
    assert cold["num_cached_tokens"] == [0, 0]
    assert warm["num_cached_tokens"] == [full_blocks_below_last(p) for p in DISK_SET]
    assert cold["tokens"] == warm["tokens"] == [expect(baseline, p) for p in DISK_SET]


def test_disk_entries_are_private_files(first_disk_run, disk_dir: Path) -> None:
    assert (disk_dir.stat().st_mode & 0o777) == 0o700
    files = list(disk_dir.glob("??/*.kvx"))
    assert len(files) == sum(len(p) // BLOCK for p in DISK_SET)
    assert all((f.stat().st_mode & 0o777) == 0o600 for f in files)


def test_second_engine_hits_disk_and_recomputes_a_corrupt_entry(
    first_disk_run, run_job, disk_dir: Path, baseline
) -> None:
    store = {"type": "disk", "path": str(disk_dir), "capacity": "256MiB"}
    steps = [
        generate(DISK_SET[0]),  # a hit refreshes its entries' mtimes: they are the newest
        {"op": "corrupt", "path": str(disk_dir), "count": 1, "newest": True},
        generate(DISK_SET[0]),
        generate(DISK_SET[1]),
    ]
    run = run_job(steps, kv=store_kv(store), enable_prefix_caching=False)
    assert results(run, "corrupt")[0]["corrupted"]
    _, first, second = results(run)
    assert first["tokens"] == [expect(baseline, DISK_SET[0])]
    assert second["tokens"] == [expect(baseline, DISK_SET[1])]
    assert second["num_cached_tokens"] == [full_blocks_below_last(DISK_SET[1])]
    stats = run["stats"]["disk"]
    assert stats["load_errors"] >= 1
    assert stats["loaded_blocks"] >= full_blocks_below_last(DISK_SET[1]) // BLOCK


def test_async_disk_loads_in_the_multi_process_layout_with_an_abort_while_loading(
    first_disk_run, run_job, disk_dir: Path, tmp_path: Path, baseline, baseline_logprobs
) -> None:
    """vLLM's default layout (engine core in its own process). Every read of the disk tier
    takes 0.5 s, so a load of 7 blocks outlasts the other request: the first request is
    aborted while it waits for its load; the engine goes on, and later loads are exact."""
    control = tmp_path / "faults.json"
    write_control(control, fault="latency", ms=500, on=["get"])
    store = {"type": "disk", "path": str(disk_dir), "capacity": "256MiB"}
    kv = store_kv(store, faults=str(control))
    kv.update(
        kv_connector="FaultyStoreConnector",
        kv_connector_module_path="tests.integration.faulty_connector",
    )
    abort = {"op": "abort_midway", "prompts": [DISK_SET[0], OTHER], "steps_before_abort": 2}
    steps = [abort, generate(*DISK_SET, logprobs=True)]
    run = run_job(steps, kv=kv, multiprocess=True, enable_prefix_caching=False)
    aborted = results(run, "abort_midway")[0]
    assert aborted["tokens"] == [None, expect(baseline, OTHER)]
    loaded = results(run)[0]
    assert loaded["num_cached_tokens"] == [full_blocks_below_last(p) for p in DISK_SET]
    assert loaded["tokens"] == [expect(baseline, p) for p in DISK_SET]
    for got, prompt in zip(loaded["logprobs"], DISK_SET, strict=True):
        want = baseline_logprobs[tuple(prompt)]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_TOLERANCE
    assert unexpected_tracebacks(run["log"]) == []


def test_bad_config_is_one_clear_error_at_start(run_job) -> None:
    from kvmux.testing.engine import EngineRunError

    accepted = (
        r"accepted: async_loads, capacity, epoch, name, offload_prompt_only, "
        r"save_queue, signing, type"
    )
    with pytest.raises(EngineRunError, match=r"store\.colour.*" + accepted):
        run_job([], kv=store_kv({"type": "memory", "capacity": "1GiB", "colour": "red"}))
