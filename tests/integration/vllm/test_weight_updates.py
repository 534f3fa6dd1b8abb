"""A weight update with requests in flight, as an RL loop does it, in real vLLM.

Move the weights, then ``reset_prefix_cache(reset_running_requests=True,
reset_connector=True)`` while one request runs and another waits for KV cache room. The
running one is preempted and scheduled again; neither may load anything stored before the
reset. The oracle: each token generated after the reset has the log-probability of a run
that had the new weights throughout, without connector (float32: an exact run moves it by
about 1e-6, KV of the old weights by about 1e-2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    BASE_ENGINE,
    ENGINE_ENV,
    generate,
    make_prompt,
    results,
    store_kv,
)
from tests.integration.vllm.test_mux_connector import mux
from tests.support.weight_update_engine import run_scripted_job

pytestmark = pytest.mark.vllm

BLOCK = 128
PROMPT = make_prompt(50, 9 * BLOCK + 1)  # 9 full blocks below its last token
MAX_TOKENS = 12
SCALE = 1.1  # the weight update: every weight times this
LOGPROB_TOLERANCE = 1e-3
# room for one request only: the second waits (looked up, then refused KV cache room)
ENGINE = {
    **BASE_ENGINE,
    "enable_prefix_caching": False,
    "num_gpu_blocks_override": 14,
    "max_model_len": 1536,
}


def _run(model: str, kv: dict[str, Any] | None, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return run_scripted_job(model, ENGINE, kv, steps, ENGINE_ENV)


def _disk(path: Path) -> dict[str, Any]:
    return {"type": "disk", "path": str(path), "capacity": "256MiB"}


def _disk_alone(tmp: Path, **options: Any) -> dict[str, Any]:
    return store_kv({**_disk(tmp / "disk"), **options})


def _memory_and_disk(tmp: Path) -> dict[str, Any]:
    return mux("compose", [{"type": "memory", "capacity": "64MiB"}, _disk(tmp / "disk")])


@pytest.mark.parametrize("connector", [_disk_alone, _memory_and_disk], ids=["disk", "mux"])
def test_requests_in_flight_at_a_weight_update_load_nothing_from_before_it(
    tiny_model: str, tmp_path: Path, connector: Callable[[Path], dict[str, Any]]
) -> None:
    steps = [
        generate(PROMPT),  # stored under the old weights
        generate(PROMPT),
        {
            "op": "update_midway",
            "prompts": [PROMPT, PROMPT],
            "max_tokens": MAX_TOKENS,
            "steps_before": 4,
            "scale": SCALE,
        },
    ]
    _check_update(tiny_model, _run(tiny_model, connector(tmp_path), steps))


@pytest.mark.parametrize("async_loads", ["always", "never"])
def test_a_reset_right_after_a_load_began_holds_too(
    tiny_model: str, tmp_path: Path, async_loads: str
) -> None:
    """The update lands one step after the requests arrive: with asynchronous loads the
    first request still waits for its load, and vLLM refuses the reset until it ends
    (the README's sequence steps and asks again); with synchronous ones it never waits."""
    update = {
        "op": "update_midway",
        "prompts": [PROMPT, PROMPT],
        "max_tokens": MAX_TOKENS,
        "steps_before": 1,
        "scale": SCALE,
    }
    kv = _disk_alone(tmp_path, async_loads=async_loads)
    run = _run(tiny_model, kv, [generate(PROMPT), generate(PROMPT), update])
    refusals = results(run, "update_midway")[0]["refusals"]
    if async_loads == "always":
        assert refusals and all("remote KV" in text for text in refusals)
    else:
        assert refusals == []
    _check_update(tiny_model, run)


def _check_update(tiny_model: str, run: dict[str, Any]) -> None:
    _, warm = results(run)
    assert warm["num_cached_tokens"] == [9 * BLOCK]  # the tier held the prompt before
    update = results(run, "update_midway")[0]
    assert update["reset"] is True
    running, waiting = update["requests"]
    assert running["finished"] and waiting["finished"]
    assert running["tokens_before_reset"] < MAX_TOKENS  # it ran across the reset
    assert waiting["tokens_before_reset"] == 0  # it waited through it
    seen = running["tokens_before_reset"]
    reference = _run(
        tiny_model,
        None,
        [
            {"op": "perturb", "scale": SCALE},
            generate(
                PROMPT + running["tokens"][:seen], max_tokens=MAX_TOKENS - seen, logprobs=True
            ),
            generate(PROMPT, max_tokens=MAX_TOKENS, logprobs=True),
        ],
    )
    after_running, after_waiting = results(reference)
    _assert_same(running["tokens"][seen:], running["logprobs"][seen:], after_running)
    _assert_same(waiting["tokens"], waiting["logprobs"], after_waiting)


def _assert_same(tokens: list[int], logprobs: list[float], reference: dict[str, Any]) -> None:
    assert tokens == reference["tokens"][0]
    worst = max(abs(a - b) for a, b in zip(logprobs, reference["logprobs"][0], strict=True))
    assert worst < LOGPROB_TOLERANCE, f"log-probabilities moved by {worst:.2e}"


HOSTILE_GENERATIONS = ["0", str(2**64), "9" * 20, "1" * 32, None]  # None: deleted


def test_a_generation_file_anyone_rewrote_only_causes_misses(
    tiny_model: str, tmp_path: Path
) -> None:
    """Whatever a writer of the tier puts in (or takes out of) the generation file, the
    engine loads nothing stored before it and keeps serving, as does an engine started
    after it."""
    folder = tmp_path / "disk"
    record = folder / "generation"
    steps: list[dict[str, Any]] = [generate(PROMPT, logprobs=True), generate(PROMPT)]
    for data in HOSTILE_GENERATIONS:
        steps += [{"op": "write_file", "path": str(record), "data": data}]
        steps += [generate(PROMPT), generate(PROMPT, logprobs=True)]
    run = _run(tiny_model, _disk_alone(tmp_path), steps)
    cold, warm, *rest = results(run)
    assert warm["num_cached_tokens"] == [9 * BLOCK]
    for data, after_write, again in zip(HOSTILE_GENERATIONS, rest[::2], rest[1::2], strict=True):
        # a record that is no record: a new generation; a deleted one: written back as it was
        assert after_write["num_cached_tokens"] == [0 if data is not None else 9 * BLOCK]
        assert again["num_cached_tokens"] == [9 * BLOCK]  # and it serves what it stores since
        _assert_same(again["tokens"][0], again["logprobs"][0], cold)
    steps = [{"op": "write_file", "path": str(record), "data": None}, generate(PROMPT)]
    restarted = _run(tiny_model, _disk_alone(tmp_path), steps)
    assert results(restarted)[0]["num_cached_tokens"] == [0]
