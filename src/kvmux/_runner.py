"""Run one vLLM engine through a scripted job, in its own process, and print JSON.

Used by the demo, the integration tests and the benchmarks:
``python -m kvmux._runner JOB.json`` prints one JSON document on its last line.
The engine core runs in this process so that kvmux's per-tier counters can be read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RESULT_MARK = "KVMUX-RESULT "


def _make_llm(job: dict[str, Any]) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs = dict(job.get("engine", {}))
    kwargs.setdefault("enforce_eager", True)
    kwargs.setdefault("skip_tokenizer_init", True)
    kwargs.setdefault("max_model_len", 4096)
    kwargs.setdefault("seed", 0)
    if job.get("kv") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**job["kv"])
    return LLM(model=job["model"], **kwargs)


def _generate(llm: Any, step: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt

    from kvmux.metrics import stats_snapshot

    params = SamplingParams(temperature=0, max_tokens=step.get("max_tokens", 8), detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in step["prompts"]]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return {
        "seconds": elapsed,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outputs],
        "stats": stats_snapshot(),
    }


def _corrupt(step: dict[str, Any]) -> dict[str, Any]:
    files = sorted(Path(step["path"]).glob("??/*.kvx"), key=lambda p: p.stat().st_mtime)
    touched = []
    for path in files[: step.get("count", 1)]:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        touched.append(path.name)
    return {"corrupted": touched}


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Start the engine, run every step, return the results."""
    from kvmux.metrics import stats_snapshot

    started = time.perf_counter()
    llm = _make_llm(job)
    results: list[dict[str, Any]] = [{"op": "start", "seconds": time.perf_counter() - started}]
    for step in job.get("steps", []):
        op = step["op"]
        if op == "generate":
            result = _generate(llm, step)
        elif op == "reset_prefix_cache":
            result = {"ok": bool(llm.reset_prefix_cache())}
        elif op == "corrupt":
            result = _corrupt(step)
        elif op == "stats":
            result = {"stats": stats_snapshot()}
        else:
            raise ValueError(f"unknown step op {op!r}")
        result["op"] = op
        results.append(result)
    return {"steps": results, "stats": stats_snapshot()}


def main() -> None:
    """Entry point: read the job file named on the command line."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    job = json.loads(Path(sys.argv[1]).read_text())
    result = run(job)
    print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
