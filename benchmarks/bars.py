"""The issue's bars, evaluated on one run's results: each a measured ratio and a verdict."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.saving import pair_costs
from benchmarks.warm import warm_ratios

__all__ = ["evaluate_bars", "format_bars"]


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next(
        (r for r in rows if all(r.get(k) == v for k, v in match.items()) and "error" not in r), None
    )


def _bar(name: str, value: float | None, limit: float, better: str) -> dict[str, Any]:
    if value is None:
        return {"bar": name, "measured": None, "limit": limit, "met": False, "note": "not measured"}
    met = value <= limit if better == "below" else value >= limit
    return {"bar": name, "measured": round(value, 4), "limit": limit, "met": met}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _get(row: dict[str, Any] | None, key: str) -> float | None:
    return None if row is None else row.get(key)


def evaluate_bars(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every bar with its measured ratio; a missing figure is reported, not hidden."""
    long_rows = results.get("long_prompts", [])
    warm = results.get("warm_ttft", [])
    lengths = sorted({r["prompt_tokens"] for r in long_rows + warm if "prompt_tokens" in r})
    length = 4096 if 4096 in lengths else (lengths[-1] if lengths else 0)
    bars = []
    # memory warm TTFT within 1.1x of vLLM's own prefix-cache hit, at 4K and at 8K tokens:
    # engines side by side, the median over the rounds
    for tokens in [n for n in (4096, 8192) if n in lengths] or [length]:
        ratios = warm_ratios(warm, tokens)
        bars.append(
            _bar(
                f"memory warm TTFT / vLLM prefix-cache warm TTFT ({tokens} tokens, "
                f"side by side, median of {len(ratios)} rounds)",
                statistics.median(ratios) if ratios else None,
                1.1,
                "below",
            )
        )
    disk = _find(long_rows, config="kvmux-mux-first", prompt_tokens=length)
    bars.append(
        _bar(
            f"disk warm TTFT / cold TTFT ({length} tokens)",
            _ratio(_get(disk, "ttft_restart_s"), _get(disk, "ttft_cold_s")),
            0.1,
            "below",
        )
    )
    for row in results.get("stores", {}).get("rows", []):
        if row.get("page_cache") == "warm":  # beside the disk get bar, not a bar of its own
            continue
        floor = 0.8 if row["tier"] == "memory" else 0.5  # memory: at least 0.8 of a copy
        name = f"{row['tier']} {row['op']} / its limit"
        bars.append(_bar(name, row.get("ratio"), floor, "above"))
    noreuse = results.get("no_reuse", [])
    layout = "multi-process"  # vLLM's default: vllm serve's and LLM's
    costs = pair_costs(noreuse, "kvmux-mux-redis", layout)
    engine_pairs = len({r.get("session", 0) for r in noreuse if r.get("layout") == layout})
    bars.append(
        _bar(
            f"saving cost ({layout}, median of {len(costs)} pairs of rounds in both orders, "
            f"{engine_pairs} engine pairs): "
            "1 - throughput(kvmux all tiers) / throughput(none)",
            statistics.median(costs) if costs else None,
            0.05,
            "below",
        )
    )
    reuse = results.get("reuse", [])
    bars.append(
        _bar(
            "reuse TTFT p50: kvmux memory+disk / LMCache",
            _ratio(
                _get(_find(reuse, config="kvmux-mux-compose"), "ttft_p50_s"),
                _get(_find(reuse, config="lmcache"), "ttft_p50_s"),
            ),
            1.0,
            "below",
        )
    )
    loading = results.get("async_loads", [])
    for tier in ("disk", "redis"):
        row = _find(loading, tier=tier, loads="async")
        size = "long" if row is None else f"{row['prompt_tokens']}-token"
        bars.append(
            _bar(
                f"decode ITL p99 while {size} prompts load from {tier} / nothing loading",
                _get(row, "itl_p99_ratio"),
                1.2,
                "below",
            )
        )
    overhead = results.get("overhead", [])
    for row in overhead:
        if row.get("connector") != "MuxConnector":
            continue
        multi = _find(overhead, connector="MultiConnector", children=row["children"])
        for side in ("scheduler", "worker"):
            bars.append(
                _bar(
                    f"MuxConnector x{row['children']} {side} time added / children's time",
                    row.get(f"{side}_added_ratio"),
                    0.10,
                    "below",
                )
            )
            added, multi_added = (
                row.get(f"{side}_added_us_per_step"),
                _get(multi, f"{side}_added_us_per_step"),
            )
            bars.append(
                _bar(
                    f"MuxConnector x{row['children']} {side} added / MultiConnector added",
                    _ratio(added, multi_added),
                    1.0,
                    "below",
                )
            )
    return bars


def format_bars(bars: list[dict[str, Any]]) -> str:
    """One line per bar: met or not, measured against its limit."""
    lines = []
    for bar in bars:
        verdict = "MET " if bar["met"] else "SHORT"
        measured = "n/a" if bar["measured"] is None else f"{bar['measured']:.3f}"
        lines.append(f"{verdict} {bar['bar']}: {measured} (bar {bar['limit']})")
    return "\n".join(lines)
