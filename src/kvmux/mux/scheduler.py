"""MuxConnector's scheduler half: asks children, picks loaders, counts finishes. No vLLM."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from kvmux.errors import KvmuxError
from kvmux.mux.capabilities import capabilities_of
from kvmux.mux.guard import ChildGuard
from kvmux.mux.plan import EMPTY_STEP, MuxStepPlan
from kvmux.policies.selection import SCORE_CAPS, Answer, Contribution, Offer, select

__all__ = ["MuxScheduler", "TransferParamsClash"]

log = logging.getLogger("kvmux.mux")
_MISS: Answer = (0, False)  # what a failing or cut-off child offers
_new = tuple.__new__  # Contribution(...) without NamedTuple's Python-level __new__ (per hit)


def _owned_blocks(blocks: Any, first: int, end: int) -> list[int]:
    """Ids of the first KV cache group's blocks ``first`` to ``end`` (exclusive).

    vLLM's ``KVCacheBlocks`` keeps the blocks themselves: reading the ids of the slice
    only costs a third of ``get_block_ids()``, which converts every block of every group
    (once per hit request, on the scheduler's critical path).
    """
    groups = getattr(blocks, "blocks", None)
    if groups is None:
        return list(blocks.get_block_ids()[0][first:end])
    return [block.block_id for block in groups[0][first:end]]


class TransferParamsClash(KvmuxError):
    """Two children returned the same kv_transfer_params key."""


class MuxScheduler:
    """Per-request load plans over the children, and what the workers must expect."""

    def __init__(
        self,
        children: Sequence[Any],
        guards: Sequence[ChildGuard],
        policy: str,
        offset_capable: Sequence[bool],
        block_size: int,
        async_only: bool = False,
    ):
        self.children = children
        self.guards = guards
        self.policy = policy
        self.offset_capable = offset_capable
        self.block_size = block_size
        self._pairs = list(zip(children, guards, strict=True))
        self._indexed = [(i, c, g) for i, (c, g) in enumerate(self._pairs)]
        self._cap = SCORE_CAPS.get(policy)  # None: the policy asks child after child
        # request -> its load plan, while it has one (only requests something loads)
        self.plans: dict[str, list[Contribution]] = {}
        self._step: MuxStepPlan | None = None  # made when the first thing is put in it
        # a model with several KV cache groups: vLLM takes its load failures only per
        # request (failed_recving), so only asynchronous offers are taken
        self.async_only = async_only
        self._declined: set[int] = set()  # children whose synchronous offer was declined
        # children whose metadata names the blocks they load (``mux_load_blocks``): the
        # plan holds None for them, and the ids are read only if such a child fails
        self._named = [capabilities_of(c).names_load_blocks for c in children]
        # this step's loads of those children: (child, blocks, first, end), read only if
        # the child has no metadata or is cut off when the step is taken
        self._unread: list[tuple[int, Any, int, int]] = []

    def _answer(self, i: int, request: Any, start: int) -> tuple[int | None, bool]:
        """Child ``i``'s offer from ``start`` on, guarded; a lookup counted."""
        child, guard = self._pairs[i]
        guard.lookups += 1
        if guard.closed:
            try:
                return child.get_num_new_matched_tokens(request, start)  # type: ignore[no-any-return]
            except Exception as exc:
                guard.fail("get_num_new_matched_tokens", exc)
                return _MISS
        # open (skipped) or half-open (the trial call)
        call = partial(child.get_num_new_matched_tokens, request, start)
        return guard.call("get_num_new_matched_tokens", call, _MISS)

    def _ask(self, request: Any, i: int, start: int) -> Offer | None:
        tokens, is_async = self._answer(i, request, start)
        if tokens and not is_async and self.async_only:
            tokens = self._decline(i)
        return None if tokens is None else Offer(start, tokens, is_async)

    def _decline(self, i: int) -> int:
        """Child ``i`` offered a synchronous load to a model with several KV cache groups."""
        if i not in self._declined:
            self._declined.add(i)
            log.warning(
                "kvmux mux: child %s offers synchronous loads; with several KV cache groups "
                "only asynchronous loads are taken (vLLM accepts their failures only per "
                "request), so its hits are not used",
                self.guards[i].label,
            )
        return 0

    def lookup(self, request: Any, num_computed: int) -> tuple[int | None, bool]:
        """Tokens the children can load together, per the policy; None while one looks."""
        if self._cap is None:
            ask = partial(self._ask, request)
            plan = select(self.policy, ask, self.offset_capable, num_computed, self.block_size)
            if plan is None:
                return None, False
            return self._keep(request.request_id, plan)
        # every child is asked from the computed tokens on, in one loop that also keeps the
        # best offer as ``selection.best_offer`` picks it (no list, no call per child)
        cap, best, top, looking = self._cap, -1, 0, False
        tokens: int | None = 0
        for i, child, guard in self._indexed:
            guard.lookups += 1
            if guard.closed:
                try:
                    tokens, is_async = child.get_num_new_matched_tokens(request, num_computed)
                except Exception as exc:
                    guard.fail("get_num_new_matched_tokens", exc)
                    continue
            else:  # open (skipped) or half-open (the trial call)
                call = partial(child.get_num_new_matched_tokens, request, num_computed)
                tokens, is_async = guard.call("get_num_new_matched_tokens", call, _MISS)
            if tokens is None:
                looking = True
                continue
            if tokens and not is_async and self.async_only:
                tokens = self._decline(i)
            score = tokens if tokens < cap else cap
            if score > top:
                best, top, best_tokens, best_async = i, score, tokens, is_async
        if looking:
            return None, False
        if best < 0:
            if self.plans:
                self.plans.pop(request.request_id, None)
            return 0, False
        contribution = _new(Contribution, (best, num_computed, best_tokens, best_async))
        self.plans[request.request_id] = [contribution]
        return best_tokens, best_async

    def _keep(self, req_id: str, plan: list[Contribution]) -> tuple[int, bool]:
        """Keep a request's load plan; what it loads altogether."""
        if not plan:
            self.plans.pop(req_id, None)
            return 0, False
        self.plans[req_id] = plan
        return sum(c.tokens for c in plan), any(c.is_async for c in plan)

    def contributions(self, req_id: str) -> list[Contribution]:
        """The current load plan of a request."""
        return self.plans.get(req_id, [])

    def _trim(self, plan: list[Contribution], allowed: int) -> list[Contribution]:
        trimmed, left = [], allowed
        for c in plan:
            if left <= 0:
                break
            trimmed.append(Contribution(c.child, c.start, min(c.tokens, left), c.is_async))
            left -= c.tokens
        return trimmed

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Tell each child its share of the load; note block ownership for the workers.

        Every child is told, so no child keeps a stale lookup; a contributor whose breaker
        opened since the lookup is told 0 tokens and its blocks are load errors.
        """
        plan = self.plans.get(request.request_id) if self.plans else None
        if not plan or num_external_tokens <= 0:
            if plan:  # allocated without the external tokens: nothing loads
                del self.plans[request.request_id]
            for child, guard in self._pairs:
                try:
                    child.update_state_after_alloc(request, blocks, 0)
                except Exception as exc:
                    guard.fail("update_state_after_alloc", exc)
            return
        if len(plan) > 1:
            self._after_alloc_with_loads(request, blocks, num_external_tokens, plan)
            return
        # one contributor (``first``, ``longest``, or ``compose`` with one)
        loader, start, tokens, is_async = plan[0]
        if tokens > num_external_tokens:
            tokens = num_external_tokens
            self.plans[request.request_id] = [Contribution(loader, start, tokens, is_async)]
        loads = False
        for i, child, guard in self._indexed:
            if i != loader:
                try:
                    child.update_state_after_alloc(request, blocks, 0)
                except Exception as exc:
                    guard.fail("update_state_after_alloc", exc)
                continue
            cut_off = not guard.closed and guard.cut_off()
            try:
                child.update_state_after_alloc(request, blocks, 0 if cut_off else tokens)
                loads = not cut_off
            except Exception as exc:
                guard.fail("update_state_after_alloc", exc)
        self._note_load(request.request_id, blocks, loader, start, tokens, is_async, loads)

    def _note_load(
        self,
        req_id: str,
        blocks: Any,
        loader: int,
        start: int,
        tokens: int,
        is_async: bool,
        loads: bool,
    ) -> None:
        """The one contributor's load in this step's plan: owned blocks, or load errors."""
        size = self.block_size
        first, end = start // size, -(-(start + tokens) // size)
        step = self._step
        if step is None:
            step = self._step = MuxStepPlan()
        if loads:
            self.guards[loader].hit_tokens += tokens
            self._own(step, loader, blocks, first, end)
        else:
            step.add_failed(_owned_blocks(blocks, first, end))
            if is_async:
                step.fail_load(req_id)
        if is_async:
            step.expect_loaders(req_id, {loader} if loads else set())

    def _after_alloc_with_loads(
        self, request: Any, blocks: Any, num_external_tokens: int, plan: list[Contribution]
    ) -> None:
        if plan[-1].end - plan[0].start > num_external_tokens:
            plan = self._trim(plan, num_external_tokens)
        self.plans[request.request_id] = plan
        shares: list[Contribution | None] = [None] * len(self._pairs)
        for c in plan:
            shares[c.child] = c
        step, size = self._current(), self.block_size
        loaders: set[int] | None = None  # async contributors that will load
        for i, child, guard in self._indexed:
            share = shares[i]
            cut_off = not guard.closed and guard.cut_off()  # opened since the lookup
            tokens = 0 if share is None or cut_off else share.tokens
            try:  # always told, so no child keeps a stale lookup
                child.update_state_after_alloc(request, blocks, tokens)
                told = True
            except Exception as exc:
                guard.fail("update_state_after_alloc", exc)
                told = False
            if share is None:
                continue
            first, end = share.start // size, -(-share.end // size)
            loads = told and not cut_off
            if loads:
                guard.hit_tokens += tokens
                self._own(step, i, blocks, first, end)
            else:
                step.add_failed(_owned_blocks(blocks, first, end))
                if share.is_async:
                    step.fail_load(request.request_id)
            if share.is_async:
                loaders = set() if loaders is None else loaders
                if loads:
                    loaders.add(i)
        if loaders is not None:
            step.expect_loaders(request.request_id, loaders)

    def _own(self, step: MuxStepPlan, i: int, blocks: Any, first: int, end: int) -> None:
        """Child ``i`` loads blocks ``first`` to ``end`` of ``blocks`` in this step."""
        if self._named[i]:  # its metadata names them: read only if it fails
            step.load_blocks[i] = None
            self._unread.append((i, blocks, first, end))
            return
        owned = _owned_blocks(blocks, first, end)
        known = step.load_blocks.get(i)
        if known is None:
            step.load_blocks[i] = owned
        else:
            known.extend(owned)

    def _current(self) -> MuxStepPlan:
        """This step's plan, made when the first thing is put in it."""
        if self._step is None:
            self._step = MuxStepPlan()
        return self._step

    def take_step(self, child_metas: Sequence[Any | None]) -> MuxStepPlan:
        """This step's plan; a child whose metadata failed, or that is cut off, loses its loads.

        A cut-off child still built its metadata and its workers still bind it (nothing
        it planned outlives the step), but they run none of its loads or saves. A step
        with nothing in it is ``EMPTY_STEP``.
        """
        step, self._step = self._step, None
        unread = self._unread
        if unread:
            self._unread = []
        for i, _, guard in self._indexed:  # not ``None in``: that compares every metadata
            if child_metas[i] is None or (not guard.closed and guard.cut_off()):
                step = self._cut_off(step, child_metas, unread)
                break
        return EMPTY_STEP if step is None else step

    def _cut_off(
        self,
        step: MuxStepPlan | None,
        child_metas: Sequence[Any | None],
        unread: list[tuple[int, Any, int, int]],
    ) -> MuxStepPlan:
        step = step or MuxStepPlan()
        for i, meta in enumerate(child_metas):
            if meta is None or self.guards[i].cut_off():
                if i in step.load_blocks and step.load_blocks[i] is None:
                    step.load_blocks[i] = [
                        block
                        for child, blocks, first, end in unread
                        if child == i
                        for block in _owned_blocks(blocks, first, end)
                    ]
                step.fail_child(i)
        return step

    def finished(
        self, req_id: str, results: Sequence[tuple[bool, dict[str, Any] | None]]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Aggregate the children's request_finished answers."""
        if self.plans:
            self.plans.pop(req_id, None)
        savers: set[int] | None = None
        merged: dict[str, Any] | None = None
        for i, (is_async, params) in enumerate(results):
            if is_async:
                savers = savers or set()
                savers.add(i)
            if params:
                merged = self._merge_params(merged, params, i, results)
        if savers:
            self._current().expect_savers(req_id, savers)
            return True, merged
        return False, merged

    def _merge_params(
        self,
        merged: dict[str, Any] | None,
        params: dict[str, Any],
        i: int,
        results: Sequence[tuple[bool, dict[str, Any] | None]],
    ) -> dict[str, Any]:
        """``merged`` with child ``i``'s kv_transfer_params; a key clash names both children."""
        if merged is None:
            return dict(params)
        for key in params.keys() & merged.keys():
            owner = next(j for j, (_, p) in enumerate(results) if p and key in p)
            raise TransferParamsClash(
                f"kv_transfer_params key {key!r} set by both child "
                f"{self.guards[owner].label} and child {self.guards[i].label}"
            )
        merged.update(params)
        return merged
