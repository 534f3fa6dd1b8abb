"""One vLLM engine in bf16 with CUDA graphs (no ``enforce_eager``) over kvmux: hits, and
log-probabilities close to a run without connector.

``python scripts/gpu_engine_check.py [--size llama-1b] [--eager] [--work DIR]``, run by
``scripts/gpu_check.sh`` (full mode, on a CUDA machine with vLLM installed). An engine
without connector computes a prompt; an engine with MuxConnector over memory and disk
computes it, has its prefix cache reset and serves it again from memory; a restarted
engine serves it from disk. bf16 is not bitwise stable across batch shapes, so the
log-probabilities are compared within ``--tolerance`` and the largest difference is
printed; the cached tokens must cover every full block.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import build_random_llama

PROMPT = [(7 * i + 3) % 1000 + 1 for i in range(1029)]  # 64 blocks of 16 tokens, and 5


def _job(
    model: Path, args: argparse.Namespace, kv: dict[str, Any] | None, repeats: int
) -> dict[str, Any]:
    generate = {"op": "generate", "prompts": [PROMPT], "max_tokens": 8, "logprobs": True}
    steps: list[dict[str, Any]] = [generate]
    for _ in range(repeats - 1):
        steps += [{"op": "reset_prefix_cache"}, generate]
    engine = {"dtype": "bfloat16", "enforce_eager": args.eager, "block_size": args.block_size}
    engine["gpu_memory_utilization"] = 0.5
    return {"model": str(model), "engine": engine, "kv": kv, "steps": steps}


def _mux(disk: Path) -> dict[str, Any]:
    tiers = [
        {"type": "memory", "capacity": "2GiB"},
        {"type": "disk", "path": str(disk), "capacity": "8GiB"},
    ]
    return {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "compose", "tiers": tiers},
    }


def _generated(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for step in run["steps"] if step["op"] == "generate"]


def main() -> int:
    """Run the three engines and print one JSON line; exit 1 if a check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="llama-1b")
    parser.add_argument("--eager", action="store_true", help="enforce_eager (CPU smoke runs)")
    parser.add_argument("--tolerance", type=float, default=0.25, help="bf16 log-probabilities")
    parser.add_argument("--block-size", type=int, default=16, help="16 on GPUs, 128 on CPU")
    parser.add_argument("--work", type=Path, default=Path("bench-results/gpu/engine"))
    args = parser.parse_args()
    model = build_random_llama(args.work / "model" / args.size, args.size, dtype="bfloat16")
    with tempfile.TemporaryDirectory(prefix="kvmux-engine-check-") as disk:
        plain = _generated(run_engine_job(_job(model, args, None, 1)))[0]
        first = _generated(run_engine_job(_job(model, args, _mux(Path(disk)), 2)))
        restart = _generated(run_engine_job(_job(model, args, _mux(Path(disk)), 1)))[0]
    block = args.block_size
    full = len(PROMPT) // block * block
    served = {"memory": first[1], "disk after a restart": restart}
    report: dict[str, Any] = {"full_block_tokens": full, "tolerance": args.tolerance}
    failed = []
    for name, run in served.items():
        cached = run["num_cached_tokens"][0]
        diff = max(
            abs(a - b) for a, b in zip(run["logprobs"][0], plain["logprobs"][0], strict=True)
        )
        report[name] = {"cached_tokens": cached, "max_logprob_diff": diff}
        if cached < full - block or diff > args.tolerance:
            failed.append(name)
    report["computed_first_pass_diff"] = max(
        abs(a - b) for a, b in zip(first[0]["logprobs"][0], plain["logprobs"][0], strict=True)
    )
    report["passed"] = not failed
    print(json.dumps(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
