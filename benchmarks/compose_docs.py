"""Compose docs/benchmarks.md and docs/bench-results from full runs of ``python -m benchmarks``.

usage: python -m benchmarks.compose_docs HEAD_MD SHORT_MD OLD_RESULTS_JSON DOCS_DIR
       DIR:COMMIT[:earlier]...

HEAD_MD is the text above "## The bars" (how to run the benchmark, what it measures),
SHORT_MD the text between the bars table and the last run's figures (the latest runs' key
figures, where the raw data lives); both are written by hand. Each DIR is a
``python -m benchmarks --out`` folder. The old results.json's own run joins its
`earlier_runs`, and so does each DIR marked `:earlier` (a run kept on record but not
shown); the other runs make the bars table, and the last one's main tables and charts are
shown, its whole report linked. The page names runs by machine and settings, and by
"latest", "2nd latest" where those read alike: run numbers, commits and the earlier runs'
figures are history, kept in results.json (`runs_commit`, `runs_commits`, `earlier_runs`),
never written into the docs.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.report import markdown_table  # the report's own tables


def label(machine: dict[str, Any]) -> str:
    """A short name of the machine's CPU."""
    cpu = machine.get("cpu", "")
    return "EPYC" if "EPYC" in cpu else "Xeon" if "Xeon" in cpu else cpu


def settings(data: dict[str, Any]) -> str:
    """The engines' allocator, the Redis and disk tiers' state at start, direct disk writes."""
    allocator = str(data.get("allocator", "glibc")).split(" ")[0].replace("system", "glibc")
    redis = data.get("redis", {}).get("filler_entries", 0)
    direct = str(data.get("disk_writes", "")).startswith("direct")
    disk = ", disk full" if "disk" in data else ""
    disk += ", disk direct" if direct else ""
    return f"{allocator}, Redis {'full' if redis else 'empty'}{disk}"


def summary(run: int, commit: str, data: dict[str, Any]) -> dict[str, Any]:
    """What results.json keeps of a run that is not the last."""
    warm = [
        {
            k: r[k]
            for k in ("config", "prompt_tokens", "ttft_warm_s", "ttft_warm_samples_s")
            if k in r
        }
        for r in data["long_prompts"]
    ]
    return {
        "run": run,
        "commit": commit,
        "seconds": data["seconds"],
        "bars": data["bars"],
        "no_reuse": data["no_reuse"],
        "warm_ttft": data["warm_ttft"],
        "long_prompts_warm": warm,
        "overhead": data["overhead"],
        "async_loads": data["async_loads"],
        "label": label(data["machine"]),
        "settings": settings(data),
    }


def cell(bar: dict[str, Any]) -> str:
    """A measured figure, marked when the bar is not met."""
    value = bar["measured"]
    text = "-" if value is None else f"{value:.3f}"
    return text if bar["met"] else f"{text} (no)"


def limit(value: float) -> str:
    """A bar's limit as written."""
    return f"{value:g}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def run_heads(runs: list[dict[str, Any]]) -> list[str]:
    """A column head per run: its machine and settings, and its place where two read alike."""
    heads = [f"{label(d['machine'])}, {settings(d)}" for d in runs]
    if len(set(heads)) == len(heads):
        return heads
    places = ["latest" if k == 1 else f"{ordinal(k)} latest" for k in range(len(runs), 0, -1)]
    return [f"{head} ({place})" for head, place in zip(heads, places, strict=True)]


def bars_table(runs: list[dict[str, Any]]) -> str:
    """Every bar of the shown runs, and whether all of them met it."""
    header = ["bar", *run_heads(runs), "bar", "met in every run shown"]
    rows = []
    for bar in runs[-1]["bars"]:
        name = bar["bar"]
        found = [next(x for x in d["bars"] if x["bar"] == name) for d in runs]
        met = all(b["met"] for b in found)
        rows.append([name, *map(cell, found), limit(bar["limit"]), "yes" if met else "no"])
    return "\n".join(markdown_table(header, rows)).rstrip()


# A run's results.md sections left off the page, to keep it short: the machine and settings
# (the page's text and column heads say them), every TTFT (the ttft chart shows them), the
# per-round rows and the bars (the page's own table). The whole report is linked.
LEFT_OFF = ("Machine", "Run settings", "long_prompts", "warm_ttft", "no_reuse", "bars")

FIGURES_NOTE = (
    "The latest run's main tables and its charts. Its whole report, with the machine, the"
    " run settings, every TTFT and the per-round rows, is `docs/bench-results/results.md`"
    " in the repository; the raw data is"
    " [bench-results/results.json](bench-results/results.json).\n\n"
)


def demoted(results_md: str) -> str:
    """A run's results.md one heading level down, its images under bench-results/, the
    sections of LEFT_OFF left off."""
    out = []
    skipping = False
    for line in results_md.splitlines():
        if line.startswith("# "):  # the run's own title: the docs page has its own
            continue
        if line.startswith("## "):
            skipping = line[3:].strip() in LEFT_OFF
        if skipping:
            continue
        if line.startswith("#"):
            line = "#" + line
        out.append(re.sub(r"\]\((?!http)([^)]+\.png)\)", r"](bench-results/\1)", line))
    return "\n".join(out).strip() + "\n"


def main() -> None:
    """Write benchmarks.md, results.json and the charts."""
    head_md, short_md, old_json, docs = (Path(a) for a in sys.argv[1:5])
    old = json.loads(old_json.read_text())
    earlier = list(old["earlier_runs"])
    next_run = earlier[-1]["run"] + 1
    earlier.append(summary(next_run, old["runs_commit"], old))
    runs: list[tuple[int, str, dict[str, Any], Path]] = []
    for n, spec in enumerate(sys.argv[5:], start=next_run + 1):
        folder, commit, *mark = spec.split(":")
        if mark not in ([], ["earlier"]):
            raise SystemExit(f"{spec}: expected DIR:COMMIT or DIR:COMMIT:earlier")
        data = json.loads((Path(folder) / "results.json").read_text())
        if mark == ["earlier"]:
            if runs:
                raise SystemExit(f"{spec}: runs marked :earlier come before the others")
            earlier.append(summary(n, commit, data))
        else:
            runs.append((n, commit, data, Path(folder)))
    table = bars_table([d for _, _, d, _ in runs])
    _, last_c, last, last_dir = runs[-1]
    text = (
        head_md.read_text().rstrip()
        + "\n\n## The bars\n\n"
        + table
        + "\n\n"
        + short_md.read_text().strip()
    )
    text += "\n\n## Figures of the last run\n\n" + FIGURES_NOTE
    text += demoted((last_dir / "results.md").read_text())
    (docs / "benchmarks.md").write_text(text)
    out = docs / "bench-results"
    for png in out.glob("*.png"):
        png.unlink()
    for f in last_dir.iterdir():
        if f.suffix in (".png", ".md"):
            shutil.copy(f, out / f.name)
    result = dict(last)
    result["runs_commit"] = last_c
    result["runs_commits"] = [e["commit"] for e in earlier] + [c for _, c, _, _ in runs]
    result["earlier_runs"] = earlier + [summary(n, c, d) for n, c, d, _ in runs[:-1]]
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
