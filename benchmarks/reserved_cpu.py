"""Per-token latency of a CPU engine by cores reserved, with and without a connector.

vLLM's CPU backend keeps cores out of the forward pass's OpenMP pool for the engine's
other processes: one per local worker, and one more per worker whenever any KV
connector is configured (meant for NIXL's threads in disaggregated prefill). kvmux
needs no core of its own: its writer and loader threads copy within the step or run at
a lower priority. ``VLLM_CPU_NUM_OF_RESERVED_CPU`` sets the number.

``python -m benchmarks.reserved_cpu [--rounds 2] [--tokens 128]`` decodes one short
prompt in vLLM's default multi-process layout, without a connector, with a kvmux memory
tier and vLLM's default reservation, and with the tier and
``VLLM_CPU_NUM_OF_RESERVED_CPU=1``, alternating the cases round by round, and prints the
median milliseconds per generated token of each.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.configs import MEMORY
from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import build_random_llama

__all__ = ["CASES", "format_table", "main", "measure"]

_TIER = {
    "kv_connector": "StoreConnector",
    "kv_connector_module_path": "kvmux.vllm",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"store": MEMORY},
}
# name, connector, VLLM_CPU_NUM_OF_RESERVED_CPU (None: vLLM's default)
CASES: tuple[tuple[str, dict[str, Any] | None, str | None], ...] = (
    ("no connector", None, None),
    ("kvmux memory tier", _TIER, None),
    ("kvmux memory tier, VLLM_CPU_NUM_OF_RESERVED_CPU=1", _TIER, "1"),
)


def _ms_per_token(
    model: Path, kv: dict[str, Any] | None, reserved: str | None, tokens: int
) -> float:
    prompt = [(7 * i) % 8000 + 1 for i in range(64)]
    job = {
        "model": str(model),
        "engine": {"dtype": "bfloat16", "max_model_len": 1024, "enable_prefix_caching": False},
        "kv": kv,
        "multiprocess": True,
        "steps": [
            {"op": "generate", "prompts": [prompt], "max_tokens": 8},  # warm-up
            {"op": "generate", "prompts": [prompt], "max_tokens": tokens},
        ],
    }
    env = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    if reserved is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = reserved
    result = run_engine_job(job, env=env, timeout=1800)
    decode = [s for s in result["steps"] if s["op"] == "generate"][-1]
    generated = max(1, len(decode["tokens"][0]))  # a random model may end early (EOS)
    return float(decode["seconds"]) * 1000 / generated


def measure(model: Path, rounds: int, tokens: int) -> list[dict[str, Any]]:
    """Median milliseconds per generated token of each case, the cases alternating."""
    samples: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    for _ in range(rounds):
        for name, kv, reserved in CASES:
            samples[name].append(_ms_per_token(model, kv, reserved, tokens))
    base = statistics.median(samples[CASES[0][0]])
    return [
        {
            "case": name,
            "ms_per_token": statistics.median(values),
            "ratio_to_no_connector": statistics.median(values) / base,
            "samples": values,
        }
        for name, values in samples.items()
    ]


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of the medians and their ratio to the engine without connector."""
    lines = ["| case | ms per token | ratio |", "|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['case']} | {row['ms_per_token']:.1f} | {row['ratio_to_no_connector']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure on the demo-sized random Llama and print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reserved_cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--work", type=Path, default=Path("bench-results/reserved-cpu"))
    args = parser.parse_args(argv)
    model = build_random_llama(args.work / "model", size="demo", dtype="bfloat16")
    print(format_table(measure(model, args.rounds, args.tokens)))


if __name__ == "__main__":
    main()
