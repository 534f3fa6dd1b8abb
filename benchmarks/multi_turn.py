"""Workload (e): multi-turn chats that feed the model's real replies back, TTFT per turn.

Each conversation is a system prompt and ``chat_turns`` user turns; turn k's prompt is
turn k-1's prompt, the model's reply and the new user text (as vLLM's
``benchmarks/multi_turn``). The engine's prefix cache is emptied before every turn, as a
busy server would have evicted it, so earlier turns come from the kvmux memory tier or
are computed again. Half the conversations save prompt blocks only (the default), half
ask for their replies saved too (``kv_transfer_params={"offload_prompt_only": false}``);
they alternate in one engine, after one unmeasured warm-up conversation. User turns and
replies are not whole blocks, so a turn's prompt ends inside a block, as in a real chat.
Per turn: median TTFT and tokens found of each half.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.configs import MEMORY
from benchmarks.e2e import Runner
from kvmux.testing.engine import run_engine_job

__all__ = ["CHAT_JOB", "MODES", "chat_rows", "multi_turn"]

CHAT_JOB = "kvmux.testing.chat_job"
MODES = {"prompt_only": None, "with_replies": {"offload_prompt_only": False}}


def _chat(runner: Runner, seed: int, params: dict[str, Any] | None) -> dict[str, Any]:
    """One conversation: a system prompt and the first user text, then more user turns."""
    plan = runner.plan
    turns = [runner.tokens(seed, plan.system_tokens + plan.chat_user_tokens)]
    turns += [runner.tokens(seed + t, plan.chat_user_tokens) for t in range(1, plan.chat_turns)]
    return {"turns": turns, "kv_transfer_params": params}


def _conversations(runner: Runner) -> list[dict[str, Any]]:
    """A warm-up conversation, then ``chat_conversations`` per mode, alternating."""
    warmup = _chat(runner, 6900, MODES["with_replies"])
    chats = [{**warmup, "turns": warmup["turns"][:2]}]
    for c in range(runner.plan.chat_conversations):
        for m, params in enumerate(MODES.values()):
            chats.append(_chat(runner, 7000 + 1000 * c + 100 * m, params))
    return chats


def _job(runner: Runner) -> dict[str, Any]:
    plan = runner.plan
    longest = plan.system_tokens + plan.chat_turns * (
        plan.chat_user_tokens + plan.chat_reply_tokens
    )
    store = {"store": MEMORY}
    return {
        "model": str(runner.model),
        "engine": {
            "dtype": plan.dtype,
            "max_model_len": longest + 256,
            "max_num_batched_tokens": longest + 256,
            "enable_prefix_caching": True,
        },
        "kv": {
            "kv_connector": "StoreConnector",
            "kv_connector_module_path": "kvmux.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": store,
        },
        "max_tokens": plan.chat_reply_tokens,
        "reset_each_turn": True,
        "warmup": runner.tokens(1, 256),
        "conversations": _conversations(runner),
    }


def chat_rows(conversations: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per turn: each mode's median TTFT and tokens found, and their ratio."""
    modes = list(MODES)
    by_mode: dict[str, list[list[dict[str, Any]]]] = {m: [] for m in modes}
    for index, chat in enumerate(conversations):
        by_mode[modes[index % len(modes)]].append(chat)
    rows = []
    for turn in range(len(conversations[0])):
        row: dict[str, Any] = {
            "config": f"turn {turn + 1}",
            "prompt_tokens": conversations[0][turn]["prompt_tokens"],
        }
        for mode in modes:
            turns = [chat[turn] for chat in by_mode[mode]]
            row[f"ttft_{mode}_s"] = statistics.median(t["ttft_s"] for t in turns)
            row[f"cached_{mode}"] = statistics.median(t["num_cached_tokens"] for t in turns)
        row["speedup"] = row["ttft_prompt_only_s"] / row["ttft_with_replies_s"]
        rows.append(row)
    return rows


def multi_turn(runner: Runner) -> list[dict[str, Any]]:
    """Workload (e): TTFT per turn, replies saved or not, kvmux memory tier."""
    work = runner.work / "multi-turn"
    work.mkdir(parents=True, exist_ok=True)
    run = run_engine_job(
        _job(runner), env=runner.engine_env, module=CHAT_JOB, cwd=work, timeout=3600
    )
    return chat_rows(run["conversations"][1:])  # the first one warmed the engine up
