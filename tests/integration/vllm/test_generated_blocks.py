"""Saving generated blocks (``offload_prompt_only``) in real vLLM: a two-turn conversation."""

from __future__ import annotations

from typing import Any

import pytest

from kvmux.testing.engine import run_engine_job
from tests.integration.conftest import BASE_ENGINE, ENGINE_ENV, make_prompt, store_kv
from tests.integration.vllm.test_mux_connector import mux

pytestmark = pytest.mark.vllm

BLOCK = 128  # the CPU backend's block size
REPLY = 300  # turn 1's reply: with its 300-token prompt, 4 full blocks of KV (599 tokens)
CHAT_A = [make_prompt(11, 300), make_prompt(12, 100)]
CHAT_B = [make_prompt(21, 300), make_prompt(22, 100)]
MEMORY = {"type": "memory", "capacity": "64MiB"}
ON = {"offload_prompt_only": False}
OFF = {"offload_prompt_only": True}
LOGPROB_TOLERANCE = 1e-3
PROMPT_BLOCKS = 300 // BLOCK * BLOCK  # what turn 2 finds when only prompts are saved
REPLY_BLOCKS = (300 + REPLY - 1) // BLOCK * BLOCK  # turn 1's every full block of KV


def _chats(tiny_model: str, kv: dict[str, Any] | None, params: list[Any]) -> list[Any]:
    """CHAT_A and CHAT_B, with their kv_transfer_params, in one engine."""
    job = {
        "model": tiny_model,
        "engine": {**BASE_ENGINE, "enable_prefix_caching": False, "max_model_len": 2048},
        "kv": kv,
        "max_tokens": REPLY,
        "logprobs": True,
        "conversations": [
            {"turns": chat, "kv_transfer_params": p}
            for chat, p in zip([CHAT_A, CHAT_B], params, strict=True)
        ],
    }
    run = run_engine_job(job, env=ENGINE_ENV, module="kvmux.testing.chat_job")
    return list(run["conversations"])


@pytest.fixture(scope="module")
def baseline(tiny_model: str) -> list[Any]:
    """Both conversations without connector."""
    return _chats(tiny_model, None, [None, None])


@pytest.fixture(scope="module")
def store_default(tiny_model: str) -> list[Any]:
    """A StoreConnector saving prompts only by default: CHAT_A asks for its reply saved."""
    return _chats(tiny_model, store_kv(MEMORY), [ON, None])


@pytest.fixture(scope="module")
def tier_on(tiny_model: str) -> list[Any]:
    """A MuxConnector tier saving replies by default: CHAT_B asks for its prompt only."""
    return _chats(tiny_model, mux("first", [{**MEMORY, **ON}]), [None, OFF])


def _assert_exact(chat: list[Any], expected: list[Any]) -> None:
    for turn, want in zip(chat, expected, strict=True):
        assert turn["tokens"] == want["tokens"]
        assert turn["logprobs"] == pytest.approx(want["logprobs"], abs=LOGPROB_TOLERANCE)


def test_the_reply_is_as_long_as_asked(baseline: list[Any]) -> None:
    assert [len(turn["tokens"]) for chat in baseline for turn in chat] == [REPLY] * 4
    assert [turn["num_cached_tokens"] for chat in baseline for turn in chat] == [0] * 4


def test_a_request_turns_reply_saving_on(store_default: list[Any], baseline: list[Any]) -> None:
    on, off = store_default
    assert [turn["num_cached_tokens"] for turn in on] == [0, REPLY_BLOCKS]
    assert [turn["num_cached_tokens"] for turn in off] == [0, PROMPT_BLOCKS]
    _assert_exact(on, baseline[0])
    _assert_exact(off, baseline[1])


def test_a_tier_saves_replies_unless_a_request_opts_out(
    tier_on: list[Any], baseline: list[Any]
) -> None:
    on, off = tier_on
    assert [turn["num_cached_tokens"] for turn in on] == [0, REPLY_BLOCKS]
    assert [turn["num_cached_tokens"] for turn in off] == [0, PROMPT_BLOCKS]
    _assert_exact(on, baseline[0])
    _assert_exact(off, baseline[1])
