"""Run one vLLM engine through a job, with steps that look at its connectors; print JSON.

Run by ``run_connector_job`` in a fresh process (vLLM spawns processes: this module is a
script, guarded by ``__main__``). The job is ``kvmux.testing.runner``'s (``model``,
``engine``, ``kv``, ``steps``); its steps:

    {"op": "generate", "prompts": [[ids...]], "max_tokens": n}    greedy, token ids only
    {"op": "reset_prefix_cache"}
    {"op": "rmtree", "path": p}                                    delete a directory
    {"op": "digest", "path": p}      sha256 of every file under p, by relative path
    {"op": "events", "dir": p}       read (and empty) RecordingExampleConnector's files
    {"op": "inspect"}                the engine's hybrid KV cache decision and connectors

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so
``inspect`` reaches the scheduler's connector.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from kvmux.testing.engine import run_engine_job
from kvmux.testing.runner import RESULT_MARK

__all__ = ["run_connector_job"]

REPO = Path(__file__).resolve().parents[2]  # where ``tests`` is importable


def run_connector_job(
    job: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run ``job`` with this module in a fresh process; return its result."""
    return run_engine_job(
        {**job, "multiprocess": False},
        env=env,
        timeout=timeout,
        module="tests.support.connector_engine",
        cwd=REPO,
    )


def _make_llm(job: dict[str, Any]) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {
        "enforce_eager": True,
        "skip_tokenizer_init": True,
        "max_model_len": 4096,
        "seed": 0,
        **job.get("engine", {}),
    }
    if job.get("kv") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**job["kv"])
    return LLM(model=job["model"], **kwargs)


def _generate(llm: Any, step: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=step.get("max_tokens", 4), detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in step["prompts"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outputs],
    }


def _inspect(llm: Any) -> dict[str, Any]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

    config = llm.llm_engine.vllm_config
    connector = llm.llm_engine.engine_core.engine_core.scheduler.connector
    children = list(getattr(connector, "children", []))
    return {
        "disable_hybrid_kv_cache_manager": config.scheduler_config.disable_hybrid_kv_cache_manager,
        "connector": type(connector).__name__,
        "children": [type(c).__name__ for c in children],
        "children_support_hma": [supports_hma(c) for c in children],
        "config_supports_hma": KVConnectorFactory.supports_hma_config(config.kv_transfer_config),
    }


def _digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Start the engine and run every step."""
    from tests.support.recording_connector import read_events

    llm = _make_llm(job)
    results: list[dict[str, Any]] = []
    for step in job.get("steps", []):
        op = step["op"]
        if op == "generate":
            result = _generate(llm, step)
        elif op == "reset_prefix_cache":
            result = {"ok": bool(llm.reset_prefix_cache())}
        elif op == "rmtree":
            shutil.rmtree(step["path"])
            result = {}
        elif op == "digest":
            result = {"files": _digest(Path(step["path"]))}
        elif op == "events":
            result = {"events": read_events(Path(step["dir"]))}
        elif op == "inspect":
            result = _inspect(llm)
        else:
            raise ValueError(f"unknown step op {op!r}")
        results.append({"op": op, **result})
    return {"steps": results}


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    outcome = run(json.loads(Path(sys.argv[1]).read_text()))
    print(RESULT_MARK + json.dumps(outcome), flush=True)
