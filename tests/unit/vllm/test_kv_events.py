"""StoreConnector's KV cache events through vLLM's own scheduler (no engine, no workers).

The scheduler collects the connector's events with its block pool's and publishes them
every step; a recording publisher stands in for ZMQ. What is checked is what a KV-aware
router needs: the tier's ``BlockStored`` carries vLLM's own block hashes of the request
(the ones the GPU prefix cache announces), the tier's medium, and ``BlockRemoved`` follows
an eviction, a failed save and a reset; nothing is recorded unless events are enabled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.config import KVEventsConfig, VllmConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored, EventBatch, KVCacheEvent
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request

from kvmux.config import parse_store_connector_config
from kvmux.keys import BlockKey
from kvmux.testing.models import build_random_llama
from kvmux.tier.scheduler.plan import SavedBlock
from kvmux.vllm import MuxConnector, StoreConnector
from kvmux.vllm import events as events_module
from kvmux.vllm.events import TierEvents, medium_of
from kvmux.vllm.metadata import StoreConnectorMetadata, StoreWorkerMetadata
from tests.support.vllm_config import create_scheduler, create_vllm_config

BLOCK = 16
PROMPT = list(range(1, 4 * BLOCK + 2))  # 4 full blocks below its last token
OTHER = list(range(1000, 1000 + 4 * BLOCK + 1))
MEMORY = {"type": "memory", "name": "ram", "capacity": "64MiB"}


class RecordingPublisher:
    """Stands in for vLLM's event publisher: keeps every published event."""

    def __init__(self) -> None:
        self.events: list[KVCacheEvent] = []

    def publish(self, events: EventBatch) -> None:
        self.events.extend(events.events)

    def shutdown(self) -> None:
        pass

    def take(self, medium: str | None = None) -> list[KVCacheEvent]:
        """Events published since the last call (of one medium), oldest first."""
        found, self.events = self.events, []
        return [e for e in found if medium is None or getattr(e, "medium", None) == medium]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_random_llama(tmp_path_factory.mktemp("model") / "tiny-llama"))


def config(model_dir: str, events: bool = True, **extra: Any) -> VllmConfig:
    """A StoreConnector (or, with ``connectors``, MuxConnector) config; events on or off."""
    connector = "MuxConnector" if "connectors" in extra else "StoreConnector"
    vllm_config = create_vllm_config(
        model_dir,
        kv_connector=connector,
        kv_connector_extra_config=extra or {"store": MEMORY},
        kv_load_failure_policy="recompute",
        block_size=BLOCK,
        max_num_batched_tokens=256,
    )
    if events:
        vllm_config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    return vllm_config


def scheduler_of(vllm_config: VllmConfig) -> tuple[Scheduler, RecordingPublisher]:
    scheduler = create_scheduler(vllm_config, num_blocks=100)
    publisher = RecordingPublisher()
    scheduler.kv_event_publisher = publisher  # type: ignore[assignment]
    return scheduler, publisher


def request(req_id: str, prompt: list[int] = PROMPT) -> Request:
    """A request hashed as the engine hashes it (sha256, this block size)."""
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    return Request(
        req_id, list(prompt), params, None, block_hasher=get_request_block_hasher(BLOCK, hash_fn)
    )


def step(scheduler: Scheduler, missing: set[BlockKey] | None = None) -> SchedulerOutput:
    """One engine step: schedule, then the model's output with these missing keys."""
    out = scheduler.schedule()
    req_ids = list(out.num_scheduled_tokens)
    kv = KVConnectorOutput(kv_connector_worker_meta=StoreWorkerMetadata(missing or set(), {}))
    runner = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[7] for _ in req_ids],
        kv_connector_output=kv,
    )
    scheduler.update_from_output(out, runner)
    return out


def hashes(req: Request, blocks: range) -> list[Any]:
    """The request's vLLM block hashes as events carry them."""
    return [maybe_convert_block_hash(req.block_hashes[i]) for i in blocks]


def stored(events: list[KVCacheEvent]) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored)]


def removed(events: list[KVCacheEvent]) -> list[Any]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def test_a_saved_block_is_stored_under_the_requests_own_block_hash(model_dir: str) -> None:
    scheduler, publisher = scheduler_of(config(model_dir))
    req = request("a")
    scheduler.add_request(req)
    step(scheduler)
    published = publisher.take()
    (event,) = [e for e in stored(published) if e.medium == "CPU"]
    assert event.block_hashes == hashes(req, range(4))
    assert event.parent_block_hash is None
    assert event.token_ids == PROMPT[: 4 * BLOCK]
    assert (event.block_size, event.lora_id, event.group_idx) == (BLOCK, None, 0)
    assert (event.locality, event.ownership) == ("LOCAL", "ram")
    gpu = [h for e in stored(published) if e.medium == "GPU" for h in e.block_hashes]
    assert event.block_hashes == gpu  # what a router matches against the GPU cache's events


def test_a_block_already_announced_is_not_announced_again(model_dir: str) -> None:
    scheduler, publisher = scheduler_of(config(model_dir))
    scheduler.add_request(request("a"))
    step(scheduler)
    publisher.take()
    scheduler.add_request(request("b"))  # same prompt: loaded from the tier, nothing saved
    step(scheduler)
    assert stored(publisher.take("CPU")) == []


def test_a_memory_tier_eviction_is_a_block_removed(model_dir: str) -> None:
    # two entries fit: a's last two blocks are kept, then evicted by c's
    tiny = {**MEMORY, "capacity": 256}
    scheduler, publisher = scheduler_of(config(model_dir, store=tiny))
    a = request("a")
    scheduler.add_request(a)
    step(scheduler)
    (event,) = stored(publisher.take("CPU"))
    assert event.block_hashes == hashes(a, range(2, 4))
    assert event.parent_block_hash == maybe_convert_block_hash(a.block_hashes[1])
    assert event.token_ids == PROMPT[2 * BLOCK : 4 * BLOCK]
    c = request("c", OTHER)
    scheduler.add_request(c)
    step(scheduler)
    published = publisher.take("CPU")
    assert sorted(removed(published)) == sorted(hashes(a, range(2, 4)))
    assert [e.block_hashes for e in stored(published)] == [hashes(c, range(2, 4))]


def test_a_save_the_workers_could_not_make_is_removed(model_dir: str) -> None:
    scheduler, publisher = scheduler_of(config(model_dir))
    a = request("a")
    scheduler.add_request(a)
    out = step(scheduler)
    meta = out.kv_connector_metadata
    assert isinstance(meta, StoreConnectorMetadata)
    publisher.take()
    step(scheduler, missing={meta.plan.saves[3].key, BlockKey(b"never-announced")})
    assert removed(publisher.take("CPU")) == hashes(a, range(3, 4))


def test_a_reset_removes_every_announced_block(model_dir: str) -> None:
    scheduler, publisher = scheduler_of(config(model_dir))
    a = request("a")
    scheduler.add_request(a)
    step(scheduler)
    publisher.take()
    connector = scheduler.connector
    assert isinstance(connector, StoreConnector)
    assert connector.reset_cache() is True
    assert removed(list(connector.take_events())) == hashes(a, range(4))
    step(scheduler)  # the evictions the memory tier plans after a reset are not told twice
    assert removed(publisher.take("CPU")) == []


def test_nothing_is_recorded_unless_events_are_enabled(model_dir: str) -> None:
    scheduler, _ = scheduler_of(config(model_dir, events=False))
    scheduler.add_request(request("a"))
    step(scheduler)
    connector = scheduler.connector
    assert isinstance(connector, StoreConnector)
    assert list(connector.take_events()) == []
    assert connector.sched is not None and connector.sched.events is None
    assert connector.sched.scheduler.take_saved() == []


def test_several_tiers_under_a_mux_each_announce_with_their_medium(
    model_dir: str, tmp_path: Path
) -> None:
    disk = {"type": "disk", "name": "ssd", "path": str(tmp_path / "kv"), "capacity": "64MiB"}
    children = [
        {"kv_connector": "StoreConnector", "kv_connector_extra_config": {"store": s}}
        for s in (MEMORY, disk)
    ]
    for child in children:
        child["kv_connector_module_path"] = "kvmux.vllm"
    scheduler, publisher = scheduler_of(config(model_dir, connectors=children))
    assert isinstance(scheduler.connector, MuxConnector)
    a = request("a")
    scheduler.add_request(a)
    step(scheduler)
    tiers = {(e.medium, e.ownership): e.block_hashes for e in stored(publisher.take())}
    assert tiers[("CPU", "ram")] == tiers[("STORAGE", "ssd")] == hashes(a, range(4))


def test_the_medium_of_each_kind_of_tier() -> None:
    def spec(store: dict[str, Any]) -> Any:
        return parse_store_connector_config({"store": store}).store

    assert medium_of(spec(MEMORY)) == ("CPU", "LOCAL")
    assert medium_of(spec({"type": "disk", "path": "/x", "capacity": "1GiB"})) == (
        "STORAGE",
        "LOCAL",
    )
    assert medium_of(spec({"type": "redis", "url": "redis://h:6379"})) == ("STORAGE", "REMOTE")


def test_events_nobody_takes_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "MAX_EVENTS", 3)
    spec = parse_store_connector_config({"store": MEMORY}).store
    tier = TierEvents(spec, BLOCK, max_tracked=2)
    req = request("a", list(range(1, 8 * BLOCK + 2)))
    tier.watch(req)
    tier.stored([SavedBlock("a", i, 0, BlockKey(bytes([i]))) for i in (0, 2, 4, 6)])
    assert tier.dropped == 1  # four runs, three kept
    kept = [hashes(req, range(i, i + 1)) for i in (2, 4, 6)]
    assert [e.block_hashes for e in stored(tier.take())] == kept
    tier.removed([BlockKey(bytes([i])) for i in (0, 2, 4, 6)])  # only the last two are held
    assert removed(tier.take()) == hashes(req, range(4, 5)) + hashes(req, range(6, 7))


def test_a_saved_generated_block_is_stored_under_its_hash(model_dir: str) -> None:
    store = {**MEMORY, "offload_prompt_only": False}
    scheduler, publisher = scheduler_of(config(model_dir, store=store))
    a = request("a")
    scheduler.add_request(a)
    step(scheduler)
    publisher.take()
    found: list[BlockStored] = []
    for _ in range(20):  # block 4 fills with the 16th token after the prompt's last
        step(scheduler)
        found.extend(stored(publisher.take("CPU")))
    (event,) = found
    assert event.block_hashes == hashes(a, range(4, 5))
    assert event.parent_block_hash == maybe_convert_block_hash(a.block_hashes[3])
    assert event.token_ids == a.all_token_ids[4 * BLOCK : 5 * BLOCK]
