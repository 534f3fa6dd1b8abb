"""Scheduler-side bookkeeping of one tier: lookups, load and save plans. No tensors.

A model may have several KV cache groups (a hybrid model: full-attention layers in one
group, sliding-window layers in another). Each group's share of a block is its own
entry (``kvmux.keys.group_key``). A full-attention group needs every block below a hit;
a sliding-window group only the blocks inside the window of the hit's next token, and
the engine hands the null block for its positions outside the window: those are never
loaded nor saved.

Loads are synchronous (the workers copy them in before the forward pass that reads
them) or asynchronous: each request's load is a ``RequestLoad`` that runs off the
forward path while vLLM holds the request back, until the workers report it finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvmux.errors import UnkeyableInput
from kvmux.keys import BlockKey, block_keys, generation_namespace, group_key
from kvmux.metrics import TierStats
from kvmux.tier.fences import SavedBlocks
from kvmux.tier.scheduler.index import TierView
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, SavedBlock, TierStepPlan

__all__ = ["NULL_BLOCK", "ScheduledRequest", "TierScheduler"]

NULL_BLOCK = 0  # the engine's placeholder for a sliding-window position outside the window


@dataclass(frozen=True)
class ScheduledRequest:
    """What the tier scheduler needs of one request scheduled this step."""

    req_id: str
    num_computed_tokens: int  # tokens already in the KV cache before this step
    num_scheduled_tokens: int  # tokens computed by this step
    block_ids: Sequence[Sequence[int]]  # per KV cache group, the request's blocks in token order
    # its generated blocks are saved too: every token id known so far (prompt and generated)
    tokens: Sequence[int] | None = None
    # the encoded extra keys of the blocks of the first n tokens (see ``kvmux.keys``), or None
    extras: Callable[[int], Sequence[bytes] | None] | None = None


@dataclass
class _RequestState:
    keys: list[list[BlockKey]]  # per group, one key per full prompt (or generated) block
    max_hit_blocks: int  # blocks a hit may cover: never the prompt's last token
    namespace: bytes  # the generation's namespace its keys are rooted in
    keyable: bool = True  # False once its generated blocks could not be keyed
    saved_upto: int = 0  # blocks below this index are saved or known present
    lookup: tuple[int, int] | None = None  # (num_computed_tokens, hit blocks) of the last lookup
    load: range | None = None  # block indices to load


class TierScheduler:
    """Decides, per request, what to load from and save to one tier."""

    def __init__(
        self,
        view: TierView,
        block_size: int,
        namespace: bytes,
        stats: TierStats,
        windows: Sequence[int | None] = (None,),
        async_loads: bool = False,
        record_saves: bool = False,
        fence_saves: bool = False,
    ):
        self._view = view
        self._block_size = block_size
        self._namespace = namespace
        self._stats = stats
        self._windows = tuple(windows)  # per group: None (full attention) or window tokens
        self._requests: dict[str, _RequestState] = {}
        self._async_loads = async_loads  # each request's load runs off the forward path
        self._pending_loads: list[BlockTransfer] = []
        self._pending_async: list[RequestLoad] = []
        self._saved: list[SavedBlock] | None = [] if record_saves else None  # see take_saved
        self._step = 0  # plans built so far
        # saves copy asynchronously (a GPU): remember their blocks to fence their reuse
        self._fences = SavedBlocks() if fence_saves else None

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
            groups = [[group_key(k, g) for k in keys] for g in range(len(self._windows))]
            limit = max(0, (len(prompt) - 1) // self._block_size)
            state = _RequestState(keys=groups, max_hit_blocks=limit, namespace=namespace)
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
        end = self._full_end(state, start)
        if end is not None and end > start:
            end = self._window_end(state, start, end)
        if end is None:
            return None
        state.lookup = (num_computed, end - start)
        return (end - start) * self._block_size

    def _full_end(self, state: _RequestState, start: int) -> int | None:
        """The end of the run from ``start`` that every full-attention group holds."""
        end = max(start, state.max_hit_blocks)
        for group, window in enumerate(self._windows):
            candidates = state.keys[group][start:end] if window is None else []
            if candidates:
                held = self._view.count_prefix_nowait(candidates)
                if held is None:
                    return None
                end = start + held
        return end

    def _window_start(self, group: int, end: int) -> int:
        """The first block group ``group`` keeps when the next token is at block ``end``."""
        window = self._windows[group]
        if window is None:
            return 0
        return max(0, end * self._block_size - window + 1) // self._block_size

    def _window_end(self, state: _RequestState, start: int, end: int) -> int | None:
        """The largest hit end, at most ``end``, whose windows every sliding group holds.

        Each window is asked for from its last block back; a missing block rules out
        every hit whose window holds it, so the next candidate ends just before it.
        """
        group = 0
        while group < len(self._windows) and end > start:
            if self._windows[group] is None:
                group += 1
                continue
            first = max(start, self._window_start(group, end))
            wanted = state.keys[group][first:end][::-1]
            held = self._view.count_prefix_nowait(wanted)
            if held is None:
                return None
            if held == len(wanted):
                group += 1
            else:  # block end - 1 - held is missing: try again below it, from the first group
                end, group = end - 1 - held, 0
        return max(start, end)

    def on_alloc(
        self, req_id: str, block_ids: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        """Plan the load of the blocks the last lookup promised (``block_ids``: per group).

        vLLM calls this again for a request whose load was asynchronous, once it is
        scheduled, with no external tokens: there is no lookup to act on then.
        """
        state = self._requests.get(req_id)
        if state is None or state.lookup is None:
            return
        num_computed, _ = state.lookup
        state.lookup = None
        self._stats.add(lookups=1, hit_tokens=max(0, num_external_tokens))
        if num_external_tokens <= 0:
            return
        start = num_computed // self._block_size
        load = range(start, start + num_external_tokens // self._block_size)
        positions = tuple(self._transfers_at(state, block_ids, index) for index in load)
        if self._async_loads:
            self._pending_async.append(RequestLoad(req_id, start, positions))
        else:
            self._pending_loads.extend(t for position in positions for t in position)
        state.load = load

    def _transfers_at(
        self, state: _RequestState, block_ids: Sequence[Sequence[int]], index: int
    ) -> tuple[BlockTransfer, ...]:
        """Every group's real block at position ``index``, with its key."""
        transfers = []
        for group, table in enumerate(block_ids):
            block = self._block_at(group, table, index)
            if block is not None:
                transfers.append(BlockTransfer(state.keys[group][index], block, group))
        return tuple(transfers)

    def failed_load(self, req_id: str, position: int) -> None:
        """The request's load failed at block ``position``: never offer it from there again.

        vLLM looks a request up again after a failed asynchronous load that left it
        nothing; offering the same blocks again could fail for ever (an entry that reads
        but never verifies). Blocks below ``position`` may still be offered.
        """
        state = self._requests.get(req_id)
        if state is not None:
            state.max_hit_blocks = min(state.max_hit_blocks, position)

    def _block_at(self, group: int, table: Sequence[int], index: int) -> int | None:
        """Group ``group``'s block at position ``index``; None outside a sliding window."""
        if index >= len(table):
            return None
        block = table[index]
        windowed = self._windows[group] is not None
        return None if windowed and block == NULL_BLOCK else block

    def build(
        self, scheduled: Iterable[ScheduledRequest], allocated: Iterable[int] = ()
    ) -> TierStepPlan:
        """The step's plan: pending loads, plus saves of every newly full block.

        A block is a prompt block, or a generated one of a request that carries its
        ``tokens``. ``allocated``: the blocks given to requests in this step, with
        ``fence_saves`` (the plan's ``fence`` then names the latest recent step that
        saved one of them).
        """
        self._step += 1
        plan = TierStepPlan(
            loads=self._pending_loads, async_loads=self._pending_async, step=self._step
        )
        self._pending_loads, self._pending_async = [], []
        planned: list[tuple[str, _RequestState, list[BlockTransfer]]] = []
        for request in scheduled:
            state = self._requests.get(request.req_id)
            if state is None:
                continue
            saves = self._plan_saves(state, request)
            if saves:
                plan.saves.extend(saves)
                plan.tables[request.req_id] = self._table(request.block_ids, state.saved_upto)
                if self._saved is not None:
                    planned.append((request.req_id, state, saves))
        plan.saves = list({t.key: t for t in plan.saves}.values())
        plan.evictions = self._view.record_saved(t.key for t in plan.saves)
        if plan.evictions:  # more new blocks than the tier holds: skip what it would drop
            dropped = set(plan.evictions)
            plan.saves = [t for t in plan.saves if t.key not in dropped]
        if self._saved is not None:
            self._saved.extend(_saved_blocks(planned, {t.key for t in plan.saves}))
        if self._fences is not None:
            plan.fence = self._fences.fence(self._step, allocated)
            self._fences.saved(self._step, (t.block_id for t in plan.saves))
        return plan

    def take_saved(self) -> list[SavedBlock]:
        """Blocks the plans built since the last call save (only with ``record_saves``).

        Each key once, with the first request that planned it. A save the workers drop
        or fail to write comes back later through ``forget``.
        """
        if self._saved is None:
            return []
        saved, self._saved = self._saved, []
        return saved

    def _table(self, block_ids: Sequence[Sequence[int]], upto: int) -> list[int]:
        """The request's real blocks below ``upto``, position by position."""
        table = []
        for index in range(upto):
            for group, ids in enumerate(block_ids):
                block = self._block_at(group, ids, index)
                if block is not None:
                    table.append(block)
        return table

    def _plan_saves(self, state: _RequestState, request: ScheduledRequest) -> list[BlockTransfer]:
        # The engine went back (a failed load is recomputed, or the request was
        # preempted): blocks past its computed tokens are computed again, and saved then.
        state.saved_upto = min(state.saved_upto, request.num_computed_tokens // self._block_size)
        if request.tokens is not None:
            self._key_generated(state, request)
        done = request.num_computed_tokens + request.num_scheduled_tokens
        allocated = min((len(ids) for ids in request.block_ids), default=0)
        full = min(done // self._block_size, len(state.keys[0]), allocated)
        # blocks just loaded are held; past the computed tokens, a failed load is recomputed
        loaded = state.load or range(0)
        loaded = range(
            loaded.start, min(loaded.stop, request.num_computed_tokens // self._block_size)
        )
        state.load = None
        saves = []
        for index in range(state.saved_upto, full):
            if index in loaded:
                continue
            for group, ids in enumerate(request.block_ids):
                key, block = state.keys[group][index], self._block_at(group, ids, index)
                if block is None or (self._view.cheap_contains and self._view.contains(key)):
                    continue
                saves.append(BlockTransfer(key, block, group))
        state.saved_upto = max(state.saved_upto, full)
        return saves

    def _key_generated(self, state: _RequestState, request: ScheduledRequest) -> None:
        """Extend the request's keys over its generated tokens' full blocks.

        The chain goes on from the prompt's keys, so the next turn of a conversation
        (this prompt, the reply and more) finds the reply's blocks. A block's tokens are
        known once it is full: a draft token past them is not among ``tokens`` yet.
        """
        tokens = request.tokens
        assert tokens is not None
        if not state.keyable or len(tokens) // self._block_size <= len(state.keys[0]):
            return
        try:
            extras = request.extras(len(tokens)) if request.extras is not None else None
        except UnkeyableInput:  # an extra key kvmux cannot encode: prompt blocks only
            state.keyable = False
            return
        keys = block_keys(state.namespace, tokens, self._block_size, extras)
        for group, known in enumerate(state.keys):
            known.extend(group_key(key, group) for key in keys[len(known) :])

    def reset(self) -> bool:
        """A new generation of the tier: nothing stored before is served after it.

        Every request's keys are dropped with it: one looked up again (preempted by the
        reset, or asked again after waiting) is keyed afresh in the new generation, and
        one that runs on is neither loaded nor saved any more (its KV may predate the
        weights the reset follows).
        """
        self._requests.clear()
        return self._view.reset()

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Keys the worker could not load: the tier does not hold them."""
        self._view.forget(keys)

    def finish(self, req_id: str) -> None:
        """Drop the state of a finished or aborted request."""
        self._requests.pop(req_id, None)


def _saved_blocks(
    planned: Iterable[tuple[str, _RequestState, list[BlockTransfer]]], kept: set[BlockKey]
) -> list[SavedBlock]:
    """The kept saves with the request and position each was planned for, each key once."""
    saved: list[SavedBlock] = []
    for req_id, state, saves in planned:
        ours = [t for t in saves if t.key in kept]
        if not ours:
            continue
        position_of = {key: index for keys in state.keys for index, key in enumerate(keys)}
        for transfer in ours:
            kept.discard(transfer.key)
            position = position_of.get(transfer.key)
            if position is not None:
                saved.append(SavedBlock(req_id, position, transfer.group, transfer.key))
    return saved
