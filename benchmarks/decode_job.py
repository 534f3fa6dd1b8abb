"""An engine job that times every token of decoding requests while long prompts arrive.

``python -m benchmarks.decode_job JOB.json`` prints one JSON document after
``RESULT_MARK``. The job computes its long prompts once (so the tier stores them), waits
until the tier has written them, then runs ``rounds`` rounds of two phases in the same
engine, each phase with fresh decoding requests into which the long prompts arrive one
every ``gap_steps`` engine steps:

- ``local``: the long prompts hit the engine's own prefix cache: nothing loads;
- ``tier``: after ``reset_prefix_cache`` they hit only the tier: every one loads.

Alternating the phases spreads whatever else the machine does over both. The engine
runs in the layout the job names (``multiprocess``: vLLM's default, ``vllm serve``'s);
the tier's writes are waited for by watching the store itself.

Each long prompt is whole blocks plus one token and asks for one token, so both phases
compute exactly the same; what differs is the load. The result holds each decoding
request's token times and each long prompt's arrival, first token and cached tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvmux.testing.runner import job_main, make_llm

__all__ = ["run"]


def _params(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, detokenize=False, ignore_eos=True)


def _prompt(tokens: list[int]) -> Any:
    from vllm import TokensPrompt

    return TokensPrompt(prompt_token_ids=tokens)


def _phase(engine: Any, job: dict[str, Any], decoders: list[list[int]], tag: str) -> dict[str, Any]:
    """Decoding requests run; the long prompts arrive among them; every token is timed."""
    ids: dict[str, int] = {}  # outputs carry the given id (or, in some releases, vLLM's own)
    for i, prompt in enumerate(decoders):
        name = f"{tag}-decode-{i}"
        ids[name] = i
        ids[engine.add_request(name, _prompt(prompt), _params(job["decode_tokens"])) or name] = i
    token_times: list[list[float]] = [[] for _ in decoders]
    waiting = list(job["long_prompts"])
    long_ids: dict[str, int] = {}
    arrivals: list[float] = []
    first_tokens: dict[int, float] = {}
    cached: dict[int, int] = {}
    steps_running, next_arrival = 0, 1
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            count = len(out.outputs[0].token_ids)
            if out.request_id in ids:
                times = token_times[ids[out.request_id]]
                times.extend([now] * (count - len(times)))
            elif out.request_id in long_ids and count:
                index = long_ids[out.request_id]
                first_tokens.setdefault(index, now)
                cached[index] = int(out.num_cached_tokens or 0)
        if all(token_times):  # every decoding request is decoding
            steps_running += 1
            if waiting and steps_running >= next_arrival:
                next_arrival += job["gap_steps"]
                name = f"{tag}-long-{len(arrivals)}"
                rid = engine.add_request(name, _prompt(waiting.pop(0)), _params(1)) or name
                long_ids[name] = long_ids[rid] = len(arrivals)
                arrivals.append(time.perf_counter())
    return {
        "token_times": token_times,
        "arrivals": arrivals,
        "first_tokens": [first_tokens.get(i) for i in range(len(arrivals))],
        "cached_tokens": [cached.get(i, 0) for i in range(len(arrivals))],
    }


def _stored_entries(job: dict[str, Any]) -> Callable[[], int]:
    """How many entries the job's tier holds now: read from the store itself, so it works
    whichever process the worker runs in."""
    from kvmux.config import parse_store_spec
    from kvmux.stores.factory import open_store

    store = open_store(parse_store_spec(job["kv"]["kv_connector_extra_config"]["store"]), False)
    return lambda: sum(1 for _ in store.walk())


def _writes_settled(count: Callable[[], int], timeout: float = 120.0, quiet: float = 1.5) -> float:
    """Wait until the tier holds entries and ``count`` has not changed for ``quiet`` s."""
    started = last_change = time.monotonic()
    seen = -1
    while time.monotonic() - started < timeout:
        now, held = time.monotonic(), count()
        if held != seen:
            seen, last_change = held, now
        elif held and now - last_change >= quiet:
            break
        time.sleep(0.1)
    return time.monotonic() - started


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Compute the long prompts, then time both phases, round after round, in one engine."""
    llm = make_llm(job)
    engine = llm.llm_engine
    llm.generate([_prompt(job["warmup"])], _params(4), use_tqdm=False)
    started = time.perf_counter()
    prompts = [_prompt(p) for p in job["long_prompts"]]
    llm.generate(prompts, _params(1), use_tqdm=False)  # computed once: the tier saves them
    computed = time.perf_counter() - started
    waited = _writes_settled(_stored_entries(job))
    phases: dict[str, list[dict[str, Any]]] = {"local": [], "tier": []}
    decoders = iter(job["decoders"])
    for round_ in range(job.get("rounds", 1)):
        # the engine's own cache holds the long prompts (computed, or loaded last round)
        phases["local"].append(_phase(engine, job, next(decoders), f"local{round_}"))
        llm.reset_prefix_cache()  # the engine's own cache only: now the tier supplies them
        phases["tier"].append(_phase(engine, job, next(decoders), f"tier{round_}"))
    return {"compute_seconds": computed, "write_seconds": waited, "phases": phases}


def main() -> None:
    """Entry point: read the job file named on the command line."""
    job_main(run)


if __name__ == "__main__":
    main()
