"""Scheduler-side bookkeeping of one tier: lookups, load and save plans. No tensors."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvmux.keys import BlockKey, block_keys, generation_namespace
from kvmux.metrics import TierStats
from kvmux.tier.index import TierView
from kvmux.tier.plan import BlockTransfer, TierStepPlan

__all__ = ["ScheduledRequest", "TierScheduler"]


@dataclass(frozen=True)
class ScheduledRequest:
    """What the tier scheduler needs of one request scheduled this step."""

    req_id: str
    num_computed_tokens: int  # tokens already in the KV cache before this step
    num_scheduled_tokens: int  # tokens computed by this step
    block_ids: Sequence[int]  # the request's blocks, in token order


@dataclass
class _RequestState:
    keys: list[BlockKey]  # one per full prompt block
    max_hit_blocks: int  # blocks a hit may cover: never the prompt's last token
    saved_upto: int = 0  # blocks below this index are saved or known present
    lookup: tuple[int, int] | None = None  # (num_computed_tokens, hit blocks) of the last lookup
    load: range | None = None  # block indices to load


class TierScheduler:
    """Decides, per request, what to load from and save to one tier."""

    def __init__(self, view: TierView, block_size: int, namespace: bytes, stats: TierStats):
        self._view = view
        self._block_size = block_size
        self._namespace = namespace
        self._stats = stats
        self._requests: dict[str, _RequestState] = {}
        self._pending_loads: list[BlockTransfer] = []

    def _state(
        self, req_id: str, prompt: Sequence[int], extras: Sequence[bytes] | None
    ) -> _RequestState | None:
        state = self._requests.get(req_id)
        if state is None:
            generation = self._view.generation()
            if generation is None:  # unknown now: neither load nor save this request
                self._stats.add(unkeyable_requests=1)
                return None
            namespace = generation_namespace(self._namespace, generation)
            keys = block_keys(namespace, prompt, self._block_size, extras)
            limit = max(0, (len(prompt) - 1) // self._block_size)
            state = _RequestState(keys=keys, max_hit_blocks=limit)
            self._requests[req_id] = state
        return state

    def lookup(
        self,
        req_id: str,
        prompt: Sequence[int],
        extras: Sequence[bytes] | None,
        num_computed: int,
    ) -> int | None:
        """Tokens the tier holds past ``num_computed`` (block-aligned); None: ask again.

        ``extras[i]`` are block i's encoded extra keys (see ``kvmux.keys``), or None.

        A start inside a block offers nothing: loading whole blocks from there would
        overwrite tokens the engine already computed.
        """
        if num_computed % self._block_size:
            return 0
        state = self._state(req_id, prompt, extras)
        if state is None:
            return 0
        start = num_computed // self._block_size
        candidates = state.keys[start : state.max_hit_blocks]
        hits = self._view.count_prefix_nowait(candidates) if candidates else 0
        if hits is None:
            return None
        state.lookup = (num_computed, hits)
        return hits * self._block_size

    def on_alloc(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """Plan the load of the blocks the last lookup promised."""
        state = self._requests.get(req_id)
        if state is None or state.lookup is None:
            return
        num_computed, _ = state.lookup
        state.lookup = None
        self._stats.add(lookups=1, hit_tokens=max(0, num_external_tokens))
        if num_external_tokens <= 0:
            return
        start = num_computed // self._block_size
        count = num_external_tokens // self._block_size
        for index in range(start, start + count):
            self._pending_loads.append(BlockTransfer(state.keys[index], block_ids[index]))
        state.load = range(start, start + count)

    def build(self, scheduled: Iterable[ScheduledRequest]) -> TierStepPlan:
        """The step's plan: pending loads, plus saves of every newly full prompt block."""
        plan = TierStepPlan(loads=self._pending_loads)
        self._pending_loads = []
        for request in scheduled:
            state = self._requests.get(request.req_id)
            if state is None:
                continue
            saves = self._plan_saves(state, request)
            if saves:
                plan.saves.extend(saves)
                plan.tables[request.req_id] = list(request.block_ids[: state.saved_upto])
        plan.saves = list({t.key: t for t in plan.saves}.values())
        plan.evictions = self._view.record_saved(t.key for t in plan.saves)
        if plan.evictions:  # more new blocks than the tier holds: skip what it would drop
            dropped = set(plan.evictions)
            plan.saves = [t for t in plan.saves if t.key not in dropped]
        return plan

    def _plan_saves(self, state: _RequestState, request: ScheduledRequest) -> list[BlockTransfer]:
        # The engine went back (a failed load is recomputed, or the request was
        # preempted): blocks past its computed tokens are computed again, and saved then.
        state.saved_upto = min(state.saved_upto, request.num_computed_tokens // self._block_size)
        done = request.num_computed_tokens + request.num_scheduled_tokens
        full = min(done // self._block_size, len(state.keys), len(request.block_ids))
        loaded = state.load or range(0)
        state.load = None
        saves = []
        for index in range(state.saved_upto, full):
            key = state.keys[index]
            if index in loaded or (self._view.cheap_contains and self._view.contains(key)):
                continue
            saves.append(BlockTransfer(key, request.block_ids[index]))
        state.saved_upto = max(state.saved_upto, full)
        return saves

    def reset(self) -> bool:
        """A new generation of the tier: nothing stored before is served to later requests."""
        return self._view.reset()

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Keys the worker could not load: the tier does not hold them."""
        self._view.forget(keys)

    def finish(self, req_id: str) -> None:
        """Drop the state of a finished or aborted request."""
        self._requests.pop(req_id, None)
