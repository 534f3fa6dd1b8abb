"""Shared fixtures of the integration tests: a tiny random Llama and vLLM job helpers."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pytest

from kvmux.testing.engine import run_engine_job
from kvmux.testing.models import build_random_llama

ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": str(os.cpu_count() or 2),
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # vLLM's log, kvmux's lines too, in run["log"]
}
# block_size: the CPU backend's own; stated so the tests mean the same on a GPU
# (scripts/gpu_check.sh), whose default is 16
BASE_ENGINE = {
    "max_num_batched_tokens": 256,
    "max_num_seqs": 8,
    "dtype": "float32",
    "block_size": 128,
}


def make_prompt(seed: int, length: int, prefix: list[int] | None = None) -> list[int]:
    """Deterministic random token ids, optionally after a shared prefix."""
    rng = random.Random(seed)
    head = list(prefix or [])
    return head + [rng.randrange(1, 1000) for _ in range(length - len(head))]


def store_kv(store: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """KVTransferConfig fields for a StoreConnector over ``store``."""
    return {
        "kv_connector": "StoreConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"store": store, **extra},
    }


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A float32 2-layer random Llama, built once per session."""
    return str(build_random_llama(tmp_path_factory.mktemp("model") / "tiny-llama"))


@pytest.fixture(scope="session")
def run_job(tiny_model: str) -> Callable[..., dict[str, Any]]:
    """Run a scripted engine on the tiny model in its own process."""

    def run(
        steps: list[dict[str, Any]],
        kv: dict[str, Any] | None = None,
        multiprocess: bool = False,
        **engine: Any,
    ) -> dict[str, Any]:
        job = {"model": tiny_model, "engine": {**BASE_ENGINE, **engine}, "kv": kv, "steps": steps}
        return run_engine_job({**job, "multiprocess": multiprocess}, env=ENGINE_ENV)

    return run


def generate(*prompts: list[int], max_tokens: int = 8, logprobs: bool = False) -> dict[str, Any]:
    """A generate step (with each generated token's log-probability if ``logprobs``)."""
    return {
        "op": "generate",
        "prompts": list(prompts),
        "max_tokens": max_tokens,
        "logprobs": logprobs,
    }


def results(run: dict[str, Any], op: str = "generate") -> list[dict[str, Any]]:
    """The results of every step of kind ``op``."""
    return [s for s in run["steps"] if s["op"] == op]
