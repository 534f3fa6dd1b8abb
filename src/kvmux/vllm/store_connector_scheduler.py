"""StoreConnector's scheduler half: vLLM's requests and steps in, the tier scheduler's plans out."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from kvmux.config import StoreSpec
from kvmux.errors import UnkeyableInput
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.index import MirrorIndex, TierView
from kvmux.tier.scheduler.plan import TierStepPlan
from kvmux.tier.scheduler.scheduler import ScheduledRequest, TierScheduler
from kvmux.vllm.events import TierEvents
from kvmux.vllm.metadata import StoreWorkerMetadata
from kvmux.vllm.request_keys import block_extras, prompt_tokens, saves_generated

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["StoreConnectorScheduler"]

log = logging.getLogger("kvmux.vllm.store_connector")


class StoreConnectorScheduler:
    """The scheduler side of one tier: lookups, load plans, saves to plan, KV events."""

    def __init__(
        self,
        spec: StoreSpec,
        scheduler: TierScheduler,
        view: TierView,
        events: TierEvents | None,
        stats: TierStats,
        block_size: int,
        fence_saves: bool,
    ):
        self.spec = spec
        self.scheduler = scheduler
        self.view = view
        self.events = events  # only when the engine publishes KV events
        self.stats = stats
        self.block_size = block_size
        self.fence_saves = fence_saves  # the workers learn when saved blocks are reused
        self._generating: dict[str, Request] = {}  # requests whose generated blocks are saved

    def lookup(self, request: Request, num_computed_tokens: int) -> int | None:
        """Tokens past ``num_computed_tokens`` that the tier holds (0 if it cannot key it;
        None while the tier is still looking)."""
        if self.events is not None:
            self.events.watch(request)
        try:
            extras = block_extras(request, self.block_size)
        except UnkeyableInput as exc:  # never stored under a key it might share
            self.stats.add(unkeyable_requests=1)
            log.warning("kvmux tier %s: request not cached: %s", self.spec.name, exc)
            return 0
        prompt = prompt_tokens(request)
        hit = self.scheduler.lookup(request.request_id, prompt, extras, num_computed_tokens)
        if saves_generated(request, not self.spec.offload_prompt_only):
            self._generating[request.request_id] = request
        return hit

    def after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external: int) -> None:
        """Plan the load of the promised blocks into the blocks just allocated."""
        block_ids = blocks.get_block_ids() if num_external > 0 else ()
        self.scheduler.on_alloc(request.request_id, block_ids, num_external)

    def build_plan(self, scheduler_output: SchedulerOutput) -> TierStepPlan:
        """This step's loads, saves and evictions (their KV events published)."""
        scheduled = map(self._with_tokens, _scheduled(scheduler_output))
        allocated = _allocated(scheduler_output) if self.fence_saves else ()
        plan = self.scheduler.build(scheduled, allocated)
        plan.idle = getattr(scheduler_output, "total_num_scheduled_tokens", None) == 0
        if self.events is not None:
            self.events.removed(plan.evictions)
            self.events.stored(self.scheduler.take_saved())
        return plan

    def _with_tokens(self, scheduled: ScheduledRequest) -> ScheduledRequest:
        """``scheduled`` with its token ids so far, if its generated blocks are saved too."""
        request = self._generating.get(scheduled.req_id)
        if request is None:
            return scheduled
        extras = partial(block_extras, request, self.block_size)
        return dataclasses.replace(scheduled, tokens=request.all_token_ids, extras=extras)

    def update_output(self, connector_output: KVConnectorOutput) -> None:
        """Forget keys the workers could not load; never offer a failed load again."""
        meta = connector_output.kv_connector_worker_meta
        if not isinstance(meta, StoreWorkerMetadata):
            return
        if meta.missing:
            self.scheduler.forget(meta.missing)
            if self.events is not None:
                self.events.removed(meta.missing)
        for req_id, position in meta.failed_loads.items():
            self.scheduler.failed_load(req_id, position)

    def finished(self, request: Request) -> None:
        """The request is done: its plans and keys go."""
        self.scheduler.finish(request.request_id)
        self._generating.pop(request.request_id, None)
        if self.events is not None:
            self.events.finish(request.request_id)

    def take_events(self) -> Iterable[KVCacheEvent]:
        """The tier's KV cache events since the last call (none unless the engine publishes)."""
        return self.events.take() if self.events is not None else ()

    def reset(self) -> bool:
        """Move the tier to a new generation; False when the tier could not be reached."""
        reset = self.scheduler.reset()
        if reset and self.events is not None:
            self.events.cleared()
        return reset

    def close(self) -> None:
        """Close the scheduler's view of the store."""
        self.view.close()


def tier_events(
    spec: StoreSpec, block_size: int, kv_cache_config: KVCacheConfig, view: TierView
) -> TierEvents:
    """The tier's KV events; the memory tier remembers every block it may evict."""
    hash_block_size = getattr(kv_cache_config, "hash_block_size", None)
    if isinstance(view, MirrorIndex):
        return TierEvents(spec, block_size, hash_block_size, max(1, view.max_entries))
    return TierEvents(spec, block_size, hash_block_size)


def _allocated(scheduler_output: SchedulerOutput) -> list[int]:
    """Blocks given to requests in this step: every block of a new request, the new blocks
    of the others (all of a resumed request's)."""
    found = [b for new in scheduler_output.scheduled_new_reqs for ids in new.block_ids for b in ids]
    for blocks in scheduler_output.scheduled_cached_reqs.new_block_ids:
        if blocks:
            found.extend(b for ids in blocks for b in ids)
    return found


def _scheduled(scheduler_output: SchedulerOutput) -> list[ScheduledRequest]:
    """The requests of a step with their blocks, as the tier scheduler needs them."""
    computed = {
        new.req_id: int(new.num_computed_tokens) for new in scheduler_output.scheduled_new_reqs
    }
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, map(int, cached.num_computed_tokens), strict=True))
    state = scheduler_output.kv_connector_block_state
    scheduled = []
    for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
        block_ids = state.get_block_ids(req_id) if state is not None else None
        if block_ids and req_id in computed:
            scheduled.append(ScheduledRequest(req_id, computed[req_id], num_tokens, block_ids))
    return scheduled
