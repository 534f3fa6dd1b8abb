"""MuxConnector's scheduler half: asks children, picks loaders, counts finishes. No vLLM.

Every hook takes vLLM's objects as they come (requests, blocks, outputs) and hands them
to the children; the load plan is the selection policy's (``policies/``), and what each
worker must expect of this step goes out in a ``MuxStepPlan``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from kvmux.errors import KvmuxError
from kvmux.mux.plan import EMPTY_STEP, MuxStepPlan
from kvmux.mux.roster import Member, Roster
from kvmux.policies.selection import Contribution, Offer, SelectionPolicy

__all__ = ["MuxScheduler", "TransferParamsClash"]

log = logging.getLogger("kvmux.mux")
Finished = tuple[bool, dict[str, Any] | None]  # a child's request_finished answer
_MISS = (0, False)  # what a failing or cut-off child offers
_NOT_FINISHED: Finished = (False, None)  # request_finished of a child that raised
_new = tuple.__new__  # Offer(...) without NamedTuple's Python-level __new__ (per lookup)


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
        roster: Roster,
        policy: SelectionPolicy,
        block_size: int,
        async_only: bool = False,
    ):
        self.roster = roster
        self.guards = roster.guards
        self.policy = policy
        self.block_size = block_size
        capabilities = roster.capabilities()
        self.offset_capable = [caps.offset_loads for caps in capabilities]
        # request -> its load plan, while it has one (only requests something loads)
        self.plans: dict[str, list[Contribution]] = {}
        self._step: MuxStepPlan | None = None  # made when the first thing is put in it
        # a model with several KV cache groups: vLLM takes its load failures only per
        # request (failed_recving), so only asynchronous offers are taken
        self.async_only = async_only
        self._declined: set[int] = set()  # children whose synchronous offer was declined
        # children whose metadata names the blocks they load (``mux_load_blocks``): the
        # plan holds None for them, and the ids are read only if such a child fails
        self._named = [caps.names_load_blocks for caps in capabilities]
        # this step's loads of those children: (child, blocks, first, end), read only if
        # the child has no metadata or is cut off when the step is taken
        self._unread: list[tuple[int, Any, int, int]] = []
        # kvmux tiers that publish no KV events have none to take
        self.event_sources = [
            m for m in roster.listening("take_events") if capabilities[m.index].publishes_events
        ]
        # children whose update_connector_output acts on their own worker metadata only
        # (a kvmux tier's) are not called without it
        self._reads_meta = [caps.output_needs_meta for caps in capabilities]
        self._output_readers = [
            m for m in roster.listening("update_connector_output") if not self._reads_meta[m.index]
        ]
        # requests added and not finished: when the last one finishes, the engine may
        # idle, so the counters go out with that step (never below 0: a vLLM that does
        # not call on_new_request reports at every finish)
        self._live = 0
        # request -> children that took its partial tail (register_finished_partial_tail)
        self._tail_keepers: dict[str, list[int]] = {}

    # -- lookups ----------------------------------------------------------------------

    def on_new_request(self, request: Any) -> None:
        """Tell every child that listens about a new request."""
        self._live += 1
        self.roster.fan_out("on_new_request", request)

    def _ask(self, request: Any, i: int, start: int) -> Offer | None:
        """Child ``i``'s offer from ``start`` on, guarded; a lookup counted."""
        member = self.roster.members[i]
        guard = member.guard
        guard.lookups += 1
        lookup = member.connector.get_num_new_matched_tokens
        if guard.closed:
            try:
                tokens, is_async = lookup(request, start)
            except Exception as exc:
                guard.fail("get_num_new_matched_tokens", exc)
                tokens, is_async = _MISS
        else:  # open (skipped) or half-open (the trial call)
            call = partial(lookup, request, start)
            tokens, is_async = guard.call("get_num_new_matched_tokens", call, _MISS)
        if tokens and not is_async and self.async_only:
            tokens = self._decline(i)
        return None if tokens is None else _new(Offer, (start, tokens, is_async))

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
        ask = partial(self._ask, request)
        plan = self.policy.select(ask, self.offset_capable, num_computed, self.block_size)
        if plan is None:
            return None, False
        if not plan:
            if self.plans:
                self.plans.pop(request.request_id, None)
            return 0, False
        self.plans[request.request_id] = plan
        if len(plan) == 1:
            return plan[0].tokens, plan[0].is_async
        return sum(c.tokens for c in plan), any(c.is_async for c in plan)

    def contributions(self, req_id: str) -> list[Contribution]:
        """The current load plan of a request."""
        return self.plans.get(req_id, [])

    def loaded_groups(self, request: Any) -> tuple[int, ...] | None:
        """The KV cache groups every contributor restores; None without a plan."""
        plan = self.contributions(request.request_id)
        if not plan:
            return None
        groups: set[int] | None = None
        for c in plan:
            ids = self.roster.connectors[c.child].get_loaded_kv_cache_group_ids(request)
            groups = set(ids) if groups is None else groups & set(ids)
        return tuple(sorted(groups or ()))

    def hit_sources(self, request: Any) -> dict[Any, int]:
        """Hit sources summed over the contributors."""
        sources: dict[Any, int] = {}
        for c in self.contributions(request.request_id):
            child = self.roster.connectors[c.child]
            for source, count in child.get_external_cache_hit_sources(request, c.tokens).items():
                sources[source] = sources.get(source, 0) + count
        return sources

    # -- allocation ---------------------------------------------------------------------

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Tell each child its share of the load; note block ownership for the workers.

        Every child is told, so no child keeps a stale lookup; a contributor whose breaker
        opened since the lookup is told 0 tokens and its blocks are load errors.
        """
        req_id = request.request_id
        plan = self.plans.get(req_id) if self.plans else None
        if plan and num_external_tokens > 0:
            if plan[-1].end - plan[0].start > num_external_tokens:
                plan = self.plans[req_id] = _trim(plan, num_external_tokens)
        elif plan:  # allocated without the external tokens: nothing loads
            del self.plans[req_id]
            plan = None
        shares: dict[int, Contribution] = {c.child: c for c in plan} if plan else {}
        loaders: set[int] | None = None  # async contributors that will load
        for member in self.roster.members:
            share = shares.get(member.index)
            guard = member.guard
            cut_off = share is not None and not guard.closed and guard.cut_off()
            tokens = 0 if share is None or cut_off else share.tokens
            try:
                member.connector.update_state_after_alloc(request, blocks, tokens)
                told = True
            except Exception as exc:
                guard.fail("update_state_after_alloc", exc)
                told = False
            if share is None:
                continue
            loads = told and not cut_off
            self._note_load(req_id, blocks, member, share, loads)
            if share.is_async:
                loaders = set() if loaders is None else loaders
                if loads:
                    loaders.add(member.index)
        if loaders is not None:
            self._current().expect_loaders(req_id, loaders)

    def _note_load(
        self, req_id: str, blocks: Any, member: Member, share: Contribution, loads: bool
    ) -> None:
        """A contributor's load in this step's plan: owned blocks, or load errors."""
        size = self.block_size
        first, end = share.start // size, -(-share.end // size)
        step = self._current()
        if loads:
            member.guard.hit_tokens += share.tokens
            self._own(step, member.index, blocks, first, end)
            return
        step.add_failed(_owned_blocks(blocks, first, end))
        if share.is_async:
            step.fail_load(req_id)

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

    # -- steps --------------------------------------------------------------------------

    def build_meta(self, scheduler_output: Any) -> tuple[tuple[Any | None, ...], MuxStepPlan]:
        """Every child's metadata (None where it raised: even past an open breaker, every
        child builds) and this step's plan."""
        metas = tuple(self.roster.fan_out("build_connector_meta", scheduler_output))
        return metas, self.take_step(metas)

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
        for i, guard in enumerate(self.guards):  # not ``None in``: that compares metadata
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

    def update_output(
        self, output: Any, parts: Sequence[Any | None] | None, open_children: Sequence[int]
    ) -> None:
        """Hand each child its own part of the workers' metadata (``parts``, None when the
        workers sent none of the mux's); open the breakers the workers opened."""
        meta = output.kv_connector_worker_meta
        if meta is None:  # nothing from the workers: each child sees None too
            self.roster.fan_out("update_connector_output", output, members=self._output_readers)
            return
        for i in open_children:
            self.guards[i].force_open()
        try:
            for member in self.roster.listening("update_connector_output"):
                part = None if parts is None else parts[member.index]
                if part is None and self._reads_meta[member.index]:
                    continue
                output.kv_connector_worker_meta = part
                try:
                    member.connector.update_connector_output(output)
                except Exception as exc:
                    member.guard.fail("update_connector_output", exc)
        finally:
            output.kv_connector_worker_meta = meta

    def take_events(self) -> list[Any]:
        """Events of every child that publishes some."""
        found: list[Any] = []
        for member in self.event_sources:
            try:
                events = member.connector.take_events()
                if events:  # a generator is true even when empty: it then adds nothing
                    found.extend(events)
            except Exception as exc:
                member.guard.fail("take_events", exc)
        return found

    # -- prefix replay checkpoints (vLLM main) -------------------------------------------

    def can_load_checkpoint(self, request: Any, num_local: int, num_external: int) -> bool:
        """The answer of the child whose planned load covers the hit's end.

        That child loads the replay-managed state at the hit's end, so its checkpoint is
        the one that counts (MultiConnector asks its one loader). It is asked from its own
        start on; no such child, or one cut off, answers False (vLLM replays).
        """
        end = num_local + num_external
        loader = self._loader_at(request.request_id, end)
        if loader is None or self.guards[loader.child].cut_off():
            return False
        start = max(num_local, loader.start)
        args = (request, start, end - start)
        return self._ask_loader(loader.child, "can_load_prefix_replay_checkpoint", args)

    def consume_checkpoint(self, request: Any, num_hit_tokens: int) -> bool:
        """The answer of the child whose planned load covers ``num_hit_tokens`` (routed as
        ``can_load_checkpoint``: that child's worker reported the checkpoint)."""
        loader = self._loader_at(request.request_id, num_hit_tokens)
        if loader is None:
            return False
        args = (request, num_hit_tokens)
        return self._ask_loader(loader.child, "consume_prefix_replay_checkpoint", args)

    def _loader_at(self, req_id: str, token: int) -> Contribution | None:
        """The request's planned load whose range ends at or covers ``token``."""
        return next((c for c in self.contributions(req_id) if c.start < token <= c.end), None)

    def _ask_loader(self, i: int, hook: str, args: tuple[Any, ...]) -> bool:
        """Child ``i``'s ``hook(*args)``, guarded: False if it raised or has no such hook."""
        method = getattr(self.roster.connectors[i], hook, None)
        if method is None:  # a vLLM without the hook
            return False
        return bool(self.guards[i].invoke(hook, method, args, False, always=True))

    # -- finishes -----------------------------------------------------------------------

    def keep_partial_tail(self, request: Any, block_ids: Any, offloads: Any) -> bool:
        """True if any child takes the request's partial tail; each that does owes its
        finished sending, as an async saver (read by ``finished``)."""
        taken = self.roster.fan_out(
            "register_finished_partial_tail", request, block_ids, offloads, default=False
        )
        keepers = [i for i, took in enumerate(taken) if took]
        if keepers:
            self._tail_keepers[request.request_id] = keepers
        return bool(keepers)

    def request_finished(self, request: Any, block_ids: Any, all_groups: bool) -> Finished:
        """Every child's request_finished (with ``all_groups``, the HMA variant for the
        children that support HMA, group 0 for the others), aggregated once."""
        results: list[Finished] = []
        hook = "request_finished_all_groups" if all_groups else "request_finished"
        for member in self.roster.members:
            try:
                if not all_groups:
                    results.append(member.connector.request_finished(request, block_ids))
                elif member.hma:
                    results.append(member.connector.request_finished_all_groups(request, block_ids))
                else:
                    results.append(member.connector.request_finished(request, block_ids[0]))
            except Exception as exc:
                member.guard.fail(hook, exc)
                results.append(_NOT_FINISHED)
        self._live -= 1
        if self._live <= 0:  # none left: the counters go out with this step
            self._live = 0
            self.roster.notices.pending = True
        keepers = self._tail_keepers.pop(request.request_id, None) if self._tail_keepers else None
        for i in keepers or ():
            results[i] = (True, results[i][1])
        return self.finished(request.request_id, results)

    def finished(self, req_id: str, results: Sequence[Finished]) -> Finished:
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
        results: Sequence[Finished],
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


def _trim(plan: list[Contribution], allowed: int) -> list[Contribution]:
    """``plan`` cut to its first ``allowed`` tokens."""
    trimmed, left = [], allowed
    for c in plan:
        if left <= 0:
            break
        trimmed.append(Contribution(c.child, c.start, min(c.tokens, left), c.is_async))
        left -= c.tokens
    return trimmed
