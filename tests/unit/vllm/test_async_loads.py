"""StoreConnector's asynchronous loads in vLLM's own scheduler (no engine, no workers).

The workers' side is played by hand: each step's model output says which loads
finished, which blocks failed and what the worker metadata holds. What is checked is
the contract with vLLM 0.32: the request waits (``WAITING_FOR_REMOTE_KVS``) while other
requests run, runs from its loaded tokens once reported, keeps the prefix below a failed
block, is not offered a failed load again, and an abort holds its blocks until the
workers report the load ended.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from kvmux.keys import BlockKey
from kvmux.testing.models import build_random_llama
from kvmux.tier.scheduler.plan import RequestLoad
from kvmux.vllm import StoreConnector
from kvmux.vllm.metadata import StoreConnectorMetadata, StoreWorkerMetadata
from tests.support.vllm_config import create_scheduler, create_vllm_config

BLOCK = 16
PROMPT = list(range(1, 4 * BLOCK + 2))  # 4 full blocks below its last token


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_random_llama(tmp_path_factory.mktemp("model") / "tiny-llama"))


@pytest.fixture
def scheduler(model_dir: str) -> Scheduler:
    """vLLM's scheduler over a StoreConnector whose memory tier loads asynchronously."""
    store = {"type": "memory", "capacity": "64MiB", "async_loads": "always"}
    config = create_vllm_config(
        model_dir,
        kv_connector="StoreConnector",
        kv_connector_extra_config={"store": store},
        kv_load_failure_policy="recompute",
        block_size=BLOCK,
        max_num_batched_tokens=256,
    )
    config.cache_config.enable_prefix_caching = False  # only the connector supplies tokens
    built = create_scheduler(config, num_blocks=100)
    assert isinstance(built.connector, StoreConnector)
    return built


def request(req_id: str, max_tokens: int = 50) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(req_id, list(PROMPT), params, None)


def step(
    scheduler: Scheduler,
    finished: set[str] | None = None,
    invalid: set[int] | None = None,
    failed_loads: dict[str, int] | None = None,
    missing: set[BlockKey] | None = None,
    failed: set[str] | None = None,
) -> SchedulerOutput:
    """One engine step: schedule, then the model's output with these worker reports."""
    out = scheduler.schedule()
    req_ids = list(out.num_scheduled_tokens)
    meta = StoreWorkerMetadata(missing or set(), failed_loads or {})
    kv = KVConnectorOutput(
        finished_recving=finished,
        invalid_block_ids=invalid or set(),
        failed_recving=failed or set(),
        kv_connector_worker_meta=meta,
    )
    runner = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[7] for _ in req_ids],
        kv_connector_output=kv,
    )
    scheduler.update_from_output(out, runner)
    return out


def async_loads(out: SchedulerOutput) -> list[RequestLoad]:
    meta = out.kv_connector_metadata
    assert isinstance(meta, StoreConnectorMetadata)
    return meta.plan.async_loads


def waiting_for_load(scheduler: Scheduler) -> tuple[SchedulerOutput, RequestLoad]:
    """ "a" computed and saved its prompt; "b", the same prompt, now waits for its load."""
    scheduler.add_request(request("a"))
    step(scheduler)  # a: prefill; its 4 full blocks are planned for saving
    scheduler.add_request(request("b"))
    out = step(scheduler)
    (load,) = async_loads(out)
    assert scheduler.requests["b"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    return out, load


def blocks_of(load: RequestLoad) -> list[int]:
    return [t.block_id for t in load.transfers]


def test_a_request_waits_for_its_load_while_others_decode(scheduler: Scheduler) -> None:
    out, load = waiting_for_load(scheduler)
    assert (load.req_id, load.start, len(load.positions)) == ("b", 0, 4)
    assert set(out.num_scheduled_tokens) == {"a"}  # a decodes meanwhile
    out = step(scheduler)
    assert set(out.num_scheduled_tokens) == {"a"}  # still loading
    step(scheduler, finished={"b"})
    out = step(scheduler)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}  # b runs from its loaded tokens
    assert [new.num_computed_tokens for new in out.scheduled_new_reqs] == [4 * BLOCK]
    meta: Any = out.kv_connector_metadata
    assert meta.plan.loads == meta.plan.async_loads == meta.plan.saves == []


def test_an_abort_while_loading_holds_the_blocks_until_the_load_ended(
    scheduler: Scheduler,
) -> None:
    _, load = waiting_for_load(scheduler)
    pool = scheduler.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()
    scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert pool.get_num_free_blocks() == free  # the loaders may still write them
    out = step(scheduler)
    assert "b" in out.finished_req_ids  # the workers learn it and stop the load
    step(scheduler, finished={"b"})  # reported once, load stopped
    assert pool.get_num_free_blocks() >= free + len(blocks_of(load))
    assert "b" not in scheduler.requests


def test_one_group_keeps_the_prefix_below_a_failed_block_and_saves_it_again(
    scheduler: Scheduler,
) -> None:
    _, load = waiting_for_load(scheduler)
    failed = load.transfers[2]
    step(
        scheduler,
        finished={"b"},
        invalid={failed.block_id},
        failed_loads={"b": 2},
        missing={failed.key},
    )
    out = step(scheduler)
    assert [new.num_computed_tokens for new in out.scheduled_new_reqs] == [2 * BLOCK]
    assert out.num_scheduled_tokens["b"] == 2 * BLOCK + 1  # blocks 2 and 3 recomputed
    meta: Any = out.kv_connector_metadata
    assert meta.plan.saves == [failed]  # the tier lost that block: saved once recomputed


def test_a_load_that_left_nothing_is_not_offered_again(scheduler: Scheduler) -> None:
    """The first block failed: vLLM looks "b" up again; the tier offers nothing, so the
    request is computed instead of looping through the same failing load."""
    _, load = waiting_for_load(scheduler)
    step(scheduler, finished={"b"}, invalid={blocks_of(load)[0]}, failed_loads={"b": 0})
    out = step(scheduler)
    assert async_loads(out) == []
    assert out.num_scheduled_tokens["b"] == len(PROMPT)  # computed from its first token


# -- several KV cache groups: failures per request ------------------------------------


@pytest.fixture
def hybrid(model_dir: str) -> Scheduler:
    """vLLM's scheduler over a full-attention group and a sliding-window group."""
    store = {"type": "memory", "capacity": "64MiB"}  # "auto": async with several groups
    config = create_vllm_config(
        model_dir,
        kv_connector="StoreConnector",
        kv_connector_extra_config={"store": store},
        kv_load_failure_policy="recompute",
        block_size=BLOCK,
        max_num_batched_tokens=256,
        disable_hybrid_kv_cache_manager=False,
    )
    config.cache_config.enable_prefix_caching = False
    shape = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    groups = [
        KVCacheGroupSpec(["layer.0"], FullAttentionSpec(**shape)),
        KVCacheGroupSpec(["layer.1"], SlidingWindowSpec(**shape, sliding_window=2 * BLOCK)),
    ]
    config.cache_config.num_gpu_blocks = 100
    return Scheduler(
        vllm_config=config,
        kv_cache_config=KVCacheConfig(num_blocks=100, kv_cache_tensors=[], kv_cache_groups=groups),
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=True,
    )


def test_several_groups_recompute_a_failed_request_and_keep_what_loaded(
    hybrid: Scheduler,
) -> None:
    """A failed request starts again from its first token; looked up again, it is
    offered the blocks below the failure only (another async load), and then runs."""
    _, load = waiting_for_load(hybrid)
    assert {t.group for t in load.transfers} == {0, 1}  # both groups load
    failed = load.positions[3][0]  # the full-attention group's block at position 3
    step(hybrid, finished={"b"}, failed={"b"}, failed_loads={"b": 3}, missing={failed.key})
    out = step(hybrid)
    (again,) = async_loads(out)  # looked up again: the three blocks below the failure
    assert (again.req_id, again.start, len(again.positions)) == ("b", 0, 3)
    step(hybrid, finished={"b"})
    out = step(hybrid)
    assert [new.num_computed_tokens for new in out.scheduled_new_reqs] == [3 * BLOCK]


def test_vllm_stops_on_block_ids_from_several_groups(hybrid: Scheduler) -> None:
    """Why a hybrid model's failures are never reported as block ids."""
    _, load = waiting_for_load(hybrid)
    with pytest.raises(RuntimeError, match="multiple KV cache groups"):
        step(hybrid, finished={"b"}, invalid={load.transfers[0].block_id})
