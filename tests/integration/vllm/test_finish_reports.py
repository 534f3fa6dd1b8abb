"""Finish reports in real vLLM: a child's stray, late or repeated reports never reach it.

vLLM's scheduler asserts that every finished transfer it is told of belongs to a request
it holds, in the right state (its issues #51786 and #53049): one stray report crashes the
engine. ``UnrulyConnector`` reports what it does not owe, as some real connectors do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvmux.testing.engine import EngineRunError
from tests.integration.conftest import generate, make_prompt, results

pytestmark = pytest.mark.vllm

BLOCK = 128
PROMPTS = [make_prompt(60 + i, 3 * BLOCK + 1 + i) for i in range(4)]
Run = Callable[..., dict[str, Any]]


def unruly(mode: str, **fields: Any) -> dict[str, Any]:
    return {
        "kv_connector": "UnrulyConnector",
        "kv_connector_module_path": "tests.integration.unruly_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"mode": mode, "delay": 3},
        **fields,
    }


def test_the_unruly_child_alone_crashes_vllm(run_job: Run) -> None:
    """The oracle: without MuxConnector between them, vLLM dies on the repeated report."""
    kv = unruly("slow", kv_load_failure_policy="recompute")
    with pytest.raises(EngineRunError, match="AssertionError"):
        run_job([generate(PROMPTS[0])], kv=kv, enable_prefix_caching=False)


def test_stray_repeated_and_post_abort_reports_never_reach_the_engine(run_job: Run) -> None:
    """A slow child loads asynchronously, fails every block and reports each load twice;
    a stray child reports every request it sees as loaded and saved, twice; one request
    is aborted while it waits for its load. The engine (in vLLM's default layout, with
    the engine core in its own process) survives, and every output equals a run without
    connector."""
    kv = {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [unruly("slow"), unruly("stray")]},
    }
    steps = [
        generate(PROMPTS[0], PROMPTS[1]),
        {"op": "abort_midway", "prompts": [PROMPTS[2], PROMPTS[3]], "steps_before_abort": 1},
        generate(PROMPTS[0]),
    ]
    run = run_job(steps, kv=kv, multiprocess=True, enable_prefix_caching=False)
    reference = run_job([generate(*PROMPTS)], enable_prefix_caching=False)
    want = results(reference)[0]["tokens"]
    first, again = results(run)
    aborted = results(run, "abort_midway")[0]
    assert first["tokens"] == want[:2]
    assert aborted["tokens"][1] == want[3]
    assert again["tokens"] == want[:1]
