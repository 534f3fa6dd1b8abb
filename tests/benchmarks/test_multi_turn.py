"""benchmarks.multi_turn: per-turn rows of the multi-turn workload, and its report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.multi_turn import MODES, _conversations, chat_rows
from benchmarks.profiles import QUICK
from benchmarks.report import write_report


def _turn(ttft: float, cached: int, prompt: int) -> dict[str, Any]:
    return {"ttft_s": ttft, "num_cached_tokens": cached, "prompt_tokens": prompt, "tokens": []}


def test_rows_take_each_modes_median_per_turn() -> None:
    prompt_only = [[_turn(1.0, 0, 600), _turn(0.8, 512, 900)]] * 2
    with_replies = [[_turn(1.0, 0, 600), _turn(0.2, 768, 900)]] * 2
    chats = [prompt_only[0], with_replies[0], prompt_only[1], with_replies[1]]
    rows = chat_rows(chats)
    assert [r["config"] for r in rows] == ["turn 1", "turn 2"]
    assert rows[1]["cached_prompt_only"] == 512
    assert rows[1]["cached_with_replies"] == 768
    assert rows[1]["speedup"] == 4.0
    assert rows[0]["prompt_tokens"] == 600


def test_conversations_alternate_the_modes() -> None:
    class Plan:
        tokens = staticmethod(lambda seed, count: [seed % 100 + 1] * count)
        plan = QUICK

    warmup, *chats = _conversations(Plan())  # type: ignore[arg-type]
    assert len(chats) == QUICK.chat_conversations * len(MODES)
    assert [c["kv_transfer_params"] for c in chats[:2]] == list(MODES.values())
    assert all(len(c["turns"]) == QUICK.chat_turns for c in chats)
    assert len(warmup["turns"]) == 2
    assert len(chats[0]["turns"][0]) == QUICK.system_tokens + QUICK.chat_user_tokens
    assert len(chats[0]["turns"][1]) == QUICK.chat_user_tokens


def test_the_report_has_the_table_and_the_chart(tmp_path: Path) -> None:
    rows = chat_rows([[_turn(1.0, 0, 600), _turn(0.8, 512, 900)]] * 2)
    write_report({"machine": {"cpu": "x"}, "multi_turn": rows}, tmp_path)
    text = (tmp_path / "results.md").read_text()
    assert "## multi_turn" in text and "ttft_with_replies_s" in text
    assert (tmp_path / "multi_turn.png").exists()
