"""An engine job of multi-turn conversations that feed the model's own replies back.

``python -m kvmux.testing.chat_job JOB.json`` prints one JSON document after
``RESULT_MARK``. Each conversation is a list of user turns (token ids); turn k's prompt
is turn k-1's prompt, the model's reply to it and the new user tokens, as in vLLM's
``benchmarks/multi_turn``. Conversations run one after another, one request at a time,
each with its own ``kv_transfer_params`` (None: none). With ``reset_each_turn`` the
engine's own prefix cache is emptied before every turn, so only the connector can supply
earlier turns. Each turn's result: TTFT, the reply, its log-probabilities (with
``logprobs``) and ``num_cached_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

from kvmux.testing.runner import job_main, make_llm, sampled_logprobs

__all__ = ["run"]


def _params(job: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0,
        max_tokens=job["max_tokens"],
        detokenize=False,
        ignore_eos=True,
        logprobs=0 if job.get("logprobs") else None,
        extra_args={"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None,
    )


def _turn(engine: Any, name: str, prompt: list[int], params: Any) -> dict[str, Any]:
    """One request alone in the engine: its first token's time and its final output."""
    from vllm import TokensPrompt

    started = time.perf_counter()
    engine.add_request(name, TokensPrompt(prompt_token_ids=prompt), params)
    first: float | None = None
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if first is None and out.outputs and out.outputs[0].token_ids:
                first = time.perf_counter()
            if out.finished:
                final = out
    assert final is not None and first is not None
    completion = final.outputs[0]
    return {
        "ttft_s": first - started,
        "prompt_tokens": len(prompt),
        "num_cached_tokens": int(final.num_cached_tokens or 0),
        "tokens": list(completion.token_ids),
        "logprobs": sampled_logprobs(completion) if params.logprobs is not None else None,
    }


def _conversation(llm: Any, job: dict[str, Any], index: int, spec: dict[str, Any]) -> list[Any]:
    """Every turn of one conversation, each prompt the last one plus its reply."""
    params = _params(job, spec.get("kv_transfer_params"))
    history: list[int] = []
    turns = []
    for number, user in enumerate(spec["turns"]):
        prompt = history + list(user)
        if job.get("reset_each_turn", True):
            llm.reset_prefix_cache()
        result = _turn(llm.llm_engine, f"chat{index}-turn{number}", prompt, params)
        history = prompt + result["tokens"]
        turns.append(result)
    return turns


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Run every conversation in one engine; per conversation, its turns' results."""
    llm = make_llm(job)
    warmup = job.get("warmup")
    if warmup:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(temperature=0, max_tokens=4, detokenize=False)
        llm.generate([TokensPrompt(prompt_token_ids=warmup)], params, use_tqdm=False)
    chats = [_conversation(llm, job, i, spec) for i, spec in enumerate(job["conversations"])]
    return {"conversations": chats}


def main() -> None:
    """Entry point: read the job file named on the command line."""
    job_main(run)


if __name__ == "__main__":
    main()
