"""kvmux demo: its prompts, and rows that are medians of warmed-up requests."""

from __future__ import annotations

from typing import Any

from kvmux.tools.demo import REQUESTS_PER_ROW, demo_prompts, demo_rows, format_table

BLOCK = 128


def test_prompts_have_one_length_and_share_no_prefix() -> None:
    prompts = demo_prompts(REQUESTS_PER_ROW + 2, 600, vocab_size=1000)
    assert {len(p) for p in prompts} == {600}
    assert len({p[0] for p in prompts}) == len(prompts)  # differ at the first token
    assert all(0 < t < 1000 for p in prompts for t in p)
    assert demo_prompts(3, 600, 1000) == demo_prompts(3, 600, 1000)


def generate(seconds: float, cached: int, memory: int, disk: int, token: int = 5) -> dict[str, Any]:
    """A generate step's result; ``memory``/``disk`` are the tiers' running hit totals."""
    stats = {"memory": {"hit_tokens": memory}, "disk": {"hit_tokens": disk}}
    return {
        "op": "generate",
        "seconds": seconds,
        "num_cached_tokens": [cached],
        "tokens": [[token]],
        "stats": stats,
    }


def engines() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    first = [
        {"op": "start", "seconds": 20.0},
        generate(9.0, 0, 0, 0, token=1),  # warm-up: slow, not counted
        generate(1.0, 0, 0, 0),
        generate(1.2, 0, 0, 0),
        generate(3.0, 0, 0, 0),  # one slow outlier
        generate(0.2, 2944, 2944, 0),
        generate(0.1, 2944, 5888, 0),
        generate(0.1, 2944, 8832, 0),
    ]
    second = [
        {"op": "start", "seconds": 20.0},
        generate(8.0, 0, 0, 0, token=2),  # the restarted engine's own warm-up
        generate(0.4, 2944, 0, 2944),
        generate(0.3, 2944, 0, 5888),
        generate(0.5, 2944, 0, 8832),
    ]
    return first, second


def test_each_row_is_the_median_of_its_requests_after_the_warm_up() -> None:
    first, second = engines()
    cold, warm, restarted = demo_rows(first, second, 3000)
    assert (cold.ttft_seconds, warm.ttft_seconds, restarted.ttft_seconds) == (1.2, 0.1, 0.4)
    assert cold.cached_tokens == 0 and cold.loaded_by_tier == {"memory": 0, "disk": 0}
    assert warm.cached_tokens == 2944 and warm.loaded_by_tier == {"memory": 2944, "disk": 0}
    assert restarted.loaded_by_tier == {"memory": 0, "disk": 2944}
    assert cold.first_tokens == warm.first_tokens == (5, 5, 5)


def test_the_table_says_what_it_measures_and_compares_to_the_cold_median() -> None:
    first, second = engines()
    text = format_table(demo_rows(first, second, 3000))
    lines = text.splitlines()
    assert lines[0].startswith("TTFT: median of 3 requests per row")
    assert "warmed up first (untimed)" in lines[0]
    assert lines[2].split()[0] == "cold" and lines[2].endswith("1.0x")
    assert "memory: 2944" in lines[3] and lines[3].endswith("12.0x")
    assert "disk: 2944" in lines[4] and lines[4].endswith("3.0x")
    assert lines[-1].endswith("yes")
