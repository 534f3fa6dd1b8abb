"""Run a scripted engine that moves its weights while requests run and wait; print JSON.

Run by ``run_scripted_job`` in a fresh process. The job is
``kvmux.testing.runner``'s; besides its steps it knows:

    {"op": "perturb", "scale": s}     multiply every weight by ``s`` (a weight update)
    {"op": "update_midway", "prompts": [[ids...]], "max_tokens": n, "steps_before": k,
     "scale": s}
        start every prompt, step the engine ``k`` times (the first requests run, the
        rest wait), then perturb the weights and
        ``reset_prefix_cache(reset_running_requests=True, reset_connector=True)`` as an
        RL loop does, and run everything to the end. Each request's result: its tokens,
        each token's log-probability, and how many tokens it had before the reset (which
        vLLM refuses while a request waits for an asynchronous load: the engine then
        steps and asks again).
    {"op": "write_file", "path": p, "data": text}   what a writer of the tier may do;
                                                     ``"data": null`` deletes the file
    {"op": "namespace"}      the scheduler's StoreConnector's namespace id, in hex (the
                             engine core runs in this process)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvmux.testing import runner
from kvmux.testing.engine import run_engine_job

__all__ = ["perturb_weights", "run_scripted_job"]

REPO = Path(__file__).resolve().parents[2]  # where ``tests`` is importable


def run_scripted_job(
    model: str,
    engine: dict[str, Any],
    kv: dict[str, Any] | None,
    steps: list[dict[str, Any]],
    env: dict[str, str],
) -> dict[str, Any]:
    """Run ``steps`` (this module's and ``kvmux.testing.runner``'s) on a fresh engine."""
    job = {"model": model, "engine": engine, "kv": kv, "steps": steps}
    return run_engine_job(job, env=env, module="tests.support.weight_update_engine", cwd=REPO)


def perturb_weights(worker: Any, scale: float) -> int:
    """On a worker: multiply every parameter of its model by ``scale``; how many."""
    import torch

    model = worker.model_runner.model
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(scale)
    return sum(1 for _ in model.parameters())


def _perturb(llm: Any, step: dict[str, Any]) -> dict[str, Any]:
    changed = llm.collective_rpc(perturb_weights, args=(float(step["scale"]),))
    return {"parameters": changed}


def _update_midway(llm: Any, step: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt

    engine = llm.llm_engine
    params = SamplingParams(
        temperature=0, max_tokens=step["max_tokens"], detokenize=False, logprobs=0
    )
    names = [f"midway-{i}" for i in range(len(step["prompts"]))]
    for name, prompt in zip(names, step["prompts"], strict=True):
        engine.add_request(name, TokensPrompt(prompt_token_ids=prompt), params)
    latest: dict[str, Any] = {}
    for _ in range(step["steps_before"]):
        latest.update({out.request_id: out for out in engine.step()})
    changed = _perturb(llm, step)["parameters"]
    reset, refusals = _reset(llm, latest)
    before = {name: _token_count(latest.get(name)) for name in names}  # at the reset
    while engine.has_unfinished_requests():
        latest.update({out.request_id: out for out in engine.step()})
    requests = [_finished(latest[name], before[name]) for name in names]
    return {"reset": reset, "refusals": refusals, "parameters": changed, "requests": requests}


def _reset(llm: Any, latest: dict[str, Any]) -> tuple[bool, list[str]]:
    """The README's sequence: vLLM refuses the reset while a request waits for an
    asynchronous load; step the engine and ask again (nothing was reset)."""
    refusals: list[str] = []
    while True:
        try:
            return llm.reset_prefix_cache(True, True), refusals
        except RuntimeError as exc:
            refusals.append(str(exc))
            if len(refusals) > 1000:
                raise
            latest.update({out.request_id: out for out in llm.llm_engine.step()})


def _token_count(output: Any) -> int:
    return 0 if output is None else len(output.outputs[0].token_ids)


def _finished(output: Any, before: int) -> dict[str, Any]:
    completion = output.outputs[0]
    return {
        "tokens": list(completion.token_ids),
        "logprobs": runner.sampled_logprobs(completion),
        "tokens_before_reset": before,
        "num_cached_tokens": int(output.num_cached_tokens or 0),
        "finished": bool(output.finished),
    }


def _write_file(step: dict[str, Any]) -> dict[str, Any]:
    path = Path(step["path"])
    if step["data"] is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(step["data"])
    return {}


def _namespace(llm: Any) -> dict[str, Any]:
    connector = llm.llm_engine.engine_core.engine_core.scheduler.connector
    return {"namespace": connector._namespace.hex()}


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Run the job: this module's steps here, every other step by ``kvmux.testing.runner``."""
    llm = runner.make_llm(job)
    steps: list[dict[str, Any]] = []
    for step in job.get("steps", []):
        if step["op"] == "perturb":
            result = _perturb(llm, step)
        elif step["op"] == "update_midway":
            result = _update_midway(llm, step)
        elif step["op"] == "write_file":
            result = _write_file(step)
        elif step["op"] == "namespace":
            result = _namespace(llm)
        else:
            result = runner.run_step(llm, step)
        steps.append({**result, "op": step["op"]})
    return {"steps": steps, "stats": runner.tier_counters(llm)}


if __name__ == "__main__":
    runner.job_main(run)
