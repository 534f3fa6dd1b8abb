"""Run one vLLM engine through a scripted job, in its own process, and print JSON.

Used by the demo, the integration tests and the benchmarks:
``python -m kvmux.testing.runner JOB.json`` prints one JSON document on its last line.
By default the engine core runs in this process so that the connectors' counters can be
read (a job with ``"multiprocess": true`` runs vLLM's default layout instead, without
counters): each
step's ``stats`` are the tiers' counters by tier name (scheduler and worker halves added
up), and the job's ``mux`` are MuxConnector's per-child counters by side and label.
A job with ``"kv_events": true`` enables vLLM's KV cache events; the ``events`` step
returns those published since the last one. A ``cpu_times`` step returns the CPU seconds
used so far by this process, the engine's processes and the step's ``pids``, by role
(``kvmux.testing.cpu_times``).
"""

from __future__ import annotations

import inspect
import json
import operator
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvmux.metrics import GAUGES, TierStats
from kvmux.testing.cpu_times import cpu_seconds, process_tree

RESULT_MARK = "KVMUX-RESULT "


def make_llm(job: dict[str, Any]) -> Any:
    """vLLM's ``LLM`` for a job: its ``engine`` arguments, ``kv`` config and ``kv_events``."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs = dict(job.get("engine", {}))
    kwargs.setdefault("enforce_eager", True)
    kwargs.setdefault("skip_tokenizer_init", True)
    kwargs.setdefault("max_model_len", 4096)
    kwargs.setdefault("seed", 0)
    if job.get("kv") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**job["kv"])
    if job.get("kv_events"):  # published to the "events" op, never to a socket
        from vllm.config import KVEventsConfig

        kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    return LLM(model=job["model"], **kwargs)


class EventRecorder:
    """Stands in for the engine's KV event publisher: keeps events for the ``events`` op."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, events: Any) -> None:
        """Keep a batch's events."""
        self.events.extend(events.events)

    def shutdown(self) -> None:
        """Nothing to close."""

    def get_publisher_config(self) -> None:
        """No socket to tell about."""


def _record_events(llm: Any) -> EventRecorder:
    """Put a recorder in place of the scheduler's KV event publisher (in-process engine)."""
    recorder = EventRecorder()
    llm.llm_engine.engine_core.engine_core.scheduler.kv_event_publisher = recorder
    return recorder


def _hash_text(value: Any) -> str:
    return value.hex() if isinstance(value, bytes) else str(value)


def event_json(event: Any) -> dict[str, Any]:
    """A KV cache event as JSON: its kind, medium, tier and hashes (hex)."""
    parent = getattr(event, "parent_block_hash", None)
    return {
        "type": type(event).__name__,
        "medium": getattr(event, "medium", None),
        "ownership": getattr(event, "ownership", None),
        "hashes": [_hash_text(h) for h in getattr(event, "block_hashes", [])],
        "parent": None if parent is None else _hash_text(parent),
        "token_ids": list(getattr(event, "token_ids", [])),
    }


def _taken_events(recorder: EventRecorder | None) -> dict[str, Any]:
    if recorder is None:
        raise ValueError("the events op needs a job with kv_events")
    events, recorder.events = recorder.events, []
    return {"events": [event_json(e) for e in events]}


def _generate(llm: Any, step: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    logprobs = 0 if step.get("logprobs") else None
    params = SamplingParams(
        temperature=0, max_tokens=step.get("max_tokens", 8), detokenize=False, logprobs=logprobs
    )
    prompts = [_prompt(p) for p in step["prompts"]]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    result = {
        "seconds": elapsed,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outputs],
        "stats": tier_counters(llm),
    }
    if logprobs is not None:
        result["logprobs"] = [sampled_logprobs(o.outputs[0]) for o in outputs]
    return result


def _prompt(spec: Any) -> Any:
    """Token ids, or ``{"embeds_seed": s, "length": n, "hidden": h}`` for random embeddings."""
    from vllm import TokensPrompt

    if isinstance(spec, dict):
        import torch
        from vllm.inputs import EmbedsPrompt

        generator = torch.Generator().manual_seed(int(spec["embeds_seed"]))
        shape = (int(spec["length"]), int(spec["hidden"]))
        return EmbedsPrompt(prompt_embeds=torch.randn(shape, generator=generator))
    return TokensPrompt(prompt_token_ids=spec)


def sampled_logprobs(completion: Any) -> list[float]:
    """The log-probability of each generated token."""
    return [
        float(position[token].logprob)
        for token, position in zip(completion.token_ids, completion.logprobs or [], strict=True)
    ]


def _abort_midway(llm: Any, step: dict[str, Any]) -> dict[str, Any]:
    """Start every prompt, abort the first after a few engine steps, finish the rest."""
    from vllm import SamplingParams, TokensPrompt

    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=step.get("max_tokens", 8), detokenize=False)
    names = [f"abort-{i}" for i in range(len(step["prompts"]))]
    ids = [
        engine.add_request(name, TokensPrompt(prompt_token_ids=p), params)
        for name, p in zip(names, step["prompts"], strict=True)
    ]
    for _ in range(step.get("steps_before_abort", 2)):
        engine.step()
    engine.abort_request([names[0]])
    finished: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = list(out.outputs[0].token_ids)
    return {"tokens": [finished.get(i, finished.get(n)) for i, n in zip(ids, names, strict=True)]}


def _touch(step: dict[str, Any]) -> dict[str, Any]:
    Path(step["path"]).touch()
    return {}


def _wait_file(step: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + step.get("timeout", 120)
    while not Path(step["path"]).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{step['path']} did not appear")
        time.sleep(0.05)
    return {}


def _cpu_times(step: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds so far of this process, the engine's below it and ``pids``, by role."""
    pids = process_tree(os.getpid()) + [int(pid) for pid in step.get("pids", [])]
    return {"seconds": cpu_seconds(pids, front_end=os.getpid())}


def _sleep(step: dict[str, Any]) -> dict[str, Any]:
    time.sleep(step["seconds"])
    return {}


SCHEDULER_HOOKS = (  # every hook vLLM's scheduler calls on its connector
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "get_loaded_kv_cache_group_ids",
    "get_external_cache_hit_sources",
    "has_pending_block_frees",
    "build_connector_meta",
    "update_connector_output",
    "take_events",
    "has_pending_push_work",
    "register_finished_partial_tail",
    "request_finished",
    "request_finished_all_groups",
)
WORKER_HOOKS = (
    "bind_connector_metadata",
    "clear_connector_metadata",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "build_connector_worker_meta",
    "get_kv_connector_stats",
)
_hook_seconds: dict[str, float] = {}


def _timed(obj: Any, name: str, bucket: str) -> None:
    original = getattr(obj, name, None)
    if original is None:  # a hook this vLLM release does not have
        return
    per_hook = f"{bucket}/{name}"  # the keys once here: the wrapper's own time is charged
    calls = f"{per_hook}/calls"  # to the connector that calls it

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            result = original(*args, **kwargs)
            if inspect.isgenerator(result):  # run it here: the caller iterates it anyway
                result = list(result)
            return result
        finally:
            elapsed = time.perf_counter() - started
            _hook_seconds[bucket] = _hook_seconds.get(bucket, 0.0) + elapsed
            _hook_seconds[per_hook] = _hook_seconds.get(per_hook, 0.0) + elapsed
            _hook_seconds[calls] = _hook_seconds.get(calls, 0) + 1

    setattr(obj, name, wrapper)


def _children_of(connector: Any) -> list[Any]:
    if hasattr(connector, "children"):
        return list(connector.children)
    return list(getattr(connector, "_connectors", []))


def _sides(llm: Any) -> dict[str, Any]:
    """The top-level connector of each side (None without a KV transfer config).

    Empty in vLLM's multi-process layout: the engine core, and with it the connectors
    and their counters, is in another process.
    """
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        return {}
    scheduler = core.scheduler.connector
    worker = get_kv_transfer_group() if has_kv_transfer_group() else None
    return {"SCHEDULER": scheduler, "WORKER": worker}


def _walk(connector: Any) -> list[Any]:
    """A connector and every connector below it."""
    if connector is None:
        return []
    found = [connector]
    for child in _children_of(connector):
        found.extend(_walk(child))
    return found


def _merge(snapshots: list[dict[str, float]]) -> dict[str, float]:
    """Counters of several halves of one tier added up; levels (gauges) take the highest."""
    merged: dict[str, float] = {}
    for snapshot in snapshots:
        for name, value in snapshot.items():
            combine = max if name in GAUGES else operator.add
            merged[name] = combine(merged.get(name, 0), value)
    return merged


def tier_counters(llm: Any) -> dict[str, dict[str, float]]:
    """Every kvmux tier's counters by tier name, both halves added up."""
    halves: dict[str, list[dict[str, float]]] = {}
    for side in _sides(llm).values():
        for connector in _walk(side):
            if isinstance(getattr(connector, "stats", None), TierStats):
                halves.setdefault(connector.tier_name, []).append(connector.stats.snapshot())
    return {name: _merge(snapshots) for name, snapshots in halves.items()}


def _mux_counters(llm: Any) -> dict[str, dict[str, float]]:
    """MuxConnector's per-child counters, by side and child label."""
    counters: dict[str, dict[str, float]] = {}
    for side, top in _sides(llm).items():
        for connector in _walk(top):
            if hasattr(connector, "child_counters"):
                for label, totals in connector.child_counters().items():
                    counters[f"{side}/{label}"] = totals
    return counters


def _instrument(llm: Any) -> dict[str, Any]:
    """Time every hook of the top-level connectors and of their children."""
    sides = _sides(llm)
    scheduler = sides["SCHEDULER"]
    for side, top, hooks in (
        ("scheduler", scheduler, SCHEDULER_HOOKS),
        ("worker", sides["WORKER"], WORKER_HOOKS),
    ):
        for child in _children_of(top):
            for name in hooks:
                _timed(child, name, f"{side}/children")
        for name in hooks:
            _timed(top, name, f"{side}/top")
    _hook_seconds.clear()
    return {"children": len(_children_of(scheduler))}


def _corrupt(step: dict[str, Any]) -> dict[str, Any]:
    """Flip a byte in ``count`` disk entries: the oldest, or with ``newest`` the newest."""
    files = sorted(
        Path(step["path"]).glob("??/*.kvx"),
        key=lambda p: p.stat().st_mtime_ns,
        reverse=bool(step.get("newest", False)),
    )
    touched = []
    for path in files[: step.get("count", 1)]:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        touched.append(path.name)
    return {"corrupted": touched}


def run_step(
    llm: Any, step: dict[str, Any], recorder: EventRecorder | None = None
) -> dict[str, Any]:
    """Run one step of a job on ``llm``; its result, ``op`` included."""
    op = step["op"]
    if op == "generate":
        result = _generate(llm, step)
    elif op == "reset_prefix_cache":
        reset = step.get("reset_connector", False)
        result = {"ok": bool(llm.reset_prefix_cache(reset_connector=reset))}
    elif op == "abort_midway":
        result = _abort_midway(llm, step)
    elif op == "instrument":
        result = _instrument(llm)
    elif op == "hook_times":
        result = {"seconds": dict(_hook_seconds)}
        if step.get("reset", False):  # the next hook_times counts from here
            _hook_seconds.clear()
    elif op == "touch":
        result = _touch(step)
    elif op == "wait_file":
        result = _wait_file(step)
    elif op == "sleep":
        result = _sleep(step)
    elif op == "cpu_times":
        result = _cpu_times(step)
    elif op == "corrupt":
        result = _corrupt(step)
    elif op == "stats":
        result = {"stats": tier_counters(llm)}
    elif op == "events":
        result = _taken_events(recorder)
    else:
        raise ValueError(f"unknown step op {op!r}")
    result["op"] = op
    return result


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Start the engine, run every step, return the results."""
    started = time.perf_counter()
    llm = make_llm(job)
    recorder = _record_events(llm) if job.get("kv_events") else None
    results: list[dict[str, Any]] = [{"op": "start", "seconds": time.perf_counter() - started}]
    results += [run_step(llm, step, recorder) for step in job.get("steps", [])]
    return {"steps": results, "stats": tier_counters(llm), "mux": _mux_counters(llm)}


def job_main(run_job: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A job module's entry point: run the job file named on the command line and print
    its result after ``RESULT_MARK`` (the line ``kvmux.testing.engine`` looks for)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    job = json.loads(Path(sys.argv[1]).read_text())
    print(RESULT_MARK + json.dumps(run_job(job)), flush=True)


def main() -> None:
    """Entry point: read the job file named on the command line."""
    job_main(run)


if __name__ == "__main__":
    main()
