"""MuxConnector's worker half: runs children's hooks in isolation, finishes exactly once.

Each hook runs on its children in a plain loop over this step's live children: a child
that raises is caught, counted and cut off (``ChildGuard.fail``), and a child whose
breaker is not closed goes through ``ChildGuard.invoke``, which skips it or makes the
half-open trial.

A child whose results call raises keeps what it owes (``_hold``): a thread of it may still
write a load's blocks or read a save's, which vLLM frees or reuses once told they are done.
Each stays owed until the child reports it, or ``give_up_seconds`` after the failed call;
loads are then finished as failed receives (recomputed), each request once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvmux.mux.accounting import FinishTracker
from kvmux.mux.capabilities import capabilities_of
from kvmux.mux.guard import ChildGuard
from kvmux.mux.plan import EMPTY_STEP, MuxStepPlan
from kvmux.mux.roster import Roster

__all__ = ["MuxWorker", "TransferResult"]

log = logging.getLogger("kvmux.mux")
_FAILED: Any = object()  # what a guarded hook returns when the child raised or was skipped
TransferResult = tuple[set[str], set[str], set[str]]  # sending, recving, failed recving
Child = tuple[int, Any, ChildGuard]  # position, connector, guard
LayerCall = tuple[int, Any]  # a child's position and whose per-layer hooks to call
_NONE: tuple[Child, ...] = ()
_NO_LAYER_CALLS: tuple[LayerCall, ...] = ()
_NO_CHILDREN: frozenset[int] = frozenset()


class _Trial:
    """The per-layer hooks of a child whose breaker is not closed, through its guard."""

    def __init__(self, worker: MuxWorker, i: int, child: Any):
        self._worker, self._i, self._child = worker, i, child

    def wait_for_layer_load(self, layer_name: str) -> None:
        """The child's, guarded."""
        self._worker.trial(
            self._i, "wait_for_layer_load", self._child.wait_for_layer_load, layer_name
        )

    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        """The child's, guarded."""
        self._worker.trial(self._i, "save_kv_layer", self._child.save_kv_layer, *args, **kwargs)


class MuxWorker:
    """Step state of the worker side: which children are live, what failed, who owes what."""

    def __init__(
        self,
        roster: Roster,
        give_up_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        per_request_failures: bool = False,
    ):
        self.roster = roster
        self.children = roster.connectors
        self.guards = roster.guards
        # several KV cache groups: vLLM takes load failures only as failed requests (block
        # ids are unique only within a group); the mux's own failed blocks stay internal
        self.per_request_failures = per_request_failures
        self._all: Sequence[Child] = [(m.index, m.connector, m.guard) for m in roster.members]
        # how long what a child owed when its results call raised waits for its report
        self._give_up_seconds = give_up_seconds
        self._clock = clock
        self._holding = False  # some child's loads or saves are held (``_hold``)
        self.recving = FinishTracker()
        self.sending = FinishTracker()
        self._step = EMPTY_STEP  # read, never changed: a step with nothing in it is shared
        self._metas: Sequence[Any | None] = ()  # the children's metadata of this step
        # this step's children: holding its metadata, taking part in its loads, in its saves
        # (each list is replaced, never changed, so a loop over it survives a failure)
        self._bound: Sequence[Child] = _NONE
        self._loaders: Sequence[Child] = _NONE
        self._savers: Sequence[Child] = _NONE
        # children whose per-layer hooks do work (kvmux tiers copy whole steps, except a
        # memory tier copying loads layer by layer): see refresh_layer_hooks
        self._per_layer: list[Child] = []
        self._asked: list[Child] = []
        self._layer_loaders: set[int] = set()
        self._layer_savers: set[int] = set()
        self._every_layer_load: Sequence[LayerCall] = _NO_LAYER_CALLS
        self._every_layer_save: Sequence[LayerCall] = _NO_LAYER_CALLS
        # kvmux tiers: told which blocks failed in a sibling before they save (a tier
        # knows its own failures), so only a step with loads and siblings needs it
        self._droppers = [c for c in self._all if capabilities_of(c[1]).drops_saves]
        self._siblings = len(self._all) > 1
        # whose wait_for_layer_load and save_kv_layer to call in this step
        self.layer_loads: Sequence[LayerCall] = _NO_LAYER_CALLS
        self.layer_saves: Sequence[LayerCall] = _NO_LAYER_CALLS
        self._load_errors: set[int] = set()
        # agreeing children left out of the step on this rank only: they still join the
        # other ranks' collective over the step's loads (see _join_if_agreeing)
        self._joiners: dict[int, Any] = {}
        self._lost: set[int] = set()  # children whose loads of this step are lost
        self._done_recving: set[str] = set()
        # request -> child -> its prefix replay checkpoint (vLLM main), until the request's
        # receive is reported: see _release_checkpoints
        self._checkpoints: dict[str, dict[int, Any]] = {}
        self.refresh_layer_hooks()

    def refresh_layer_hooks(self) -> None:
        """Note each child's capabilities (``mux/capabilities.py``): whose per-layer hooks
        do work (loads, any foreign child; saves, the same unless said) and who agrees its
        loads with the other ranks. A child may know only once it adopted the KV cache, so
        this runs again after registering it."""
        self._caps = [capabilities_of(child) for _, child, _ in self._all]
        self._layer_loaders = {i for i, _, _ in self._all if self._caps[i].layer_loads}
        self._layer_savers = {i for i, _, _ in self._all if self._caps[i].saves_layers}
        doing = self._layer_loaders | self._layer_savers
        self._per_layer = [c for c in self._all if c[0] in doing]
        # children that say per step whether they have per-layer work: asked before each
        # step's layer calls (others, foreign connectors, are not asked: as MultiConnector)
        self._asked = [c for c in self._per_layer if self._caps[c[0]].layer_work_by_step]
        self._every_layer_load = [(i, c) for i, c, _ in self._all if i in self._layer_loaders]
        self._every_layer_save = [(i, c) for i, c, _ in self._all if i in self._layer_savers]

    def register_kv_caches(self, kv_caches: Any) -> None:
        """Give every child the KV caches; a child may then take on per-layer work."""
        self.roster.fan_out("register_kv_caches", kv_caches)
        self.refresh_layer_hooks()

    def handle_preemptions(self, child_metas: Sequence[Any | None]) -> None:
        """Each child handles preemptions with its own metadata (if it has any)."""
        for member, meta in zip(self.roster.members, child_metas, strict=True):
            if meta is not None:
                self.roster.fan_out("handle_preemptions", meta, members=(member,))

    def worker_meta(self) -> tuple[tuple[Any | None, ...], frozenset[int]] | None:
        """Each child's worker metadata and the children this worker has cut off; None
        when there is neither."""
        metas = self.roster.fan_out("build_connector_worker_meta")
        opened = frozenset(i for i, _, guard in self._all if not guard.closed and guard.cut_off())
        if not opened and metas.count(None) == len(metas):
            return None
        return tuple(metas), opened

    def begin_step(self, plan: MuxStepPlan, child_metas: Sequence[Any | None]) -> None:
        """Bind each child's metadata; children unbound or cut off lose their loads."""
        self._step = plan
        self._metas = child_metas
        if self._lost:
            self._lost = set()
        if plan is not EMPTY_STEP:
            if plan.failed_blocks:
                self._load_errors.update(plan.failed_blocks)
            if plan.async_loaders or plan.async_savers:
                self._expect(plan)
        left_out: dict[int, bool] | None = None  # child -> whether it is bound
        self._joiners = {}
        cut = plan.cut_off
        for i, child, guard in self._all:
            meta = child_metas[i]
            if meta is None:
                left_out = left_out or {}
                left_out[i] = False
                continue
            try:  # even past an open breaker: a cut-off child sees its step
                child.bind_connector_metadata(meta)
            except Exception as exc:
                guard.fail("bind_connector_metadata", exc)
                left_out = left_out or {}
                left_out[i] = False
                self._join_if_agreeing(i, child, meta)
                continue
            if cut and i in cut:  # the scheduler's word: the same on every rank
                guard.note("skipped_calls")
                left_out = left_out or {}
                left_out[i] = True
            elif not guard.closed and guard.cut_off():  # this rank's own breaker
                guard.note("skipped_calls")
                left_out = left_out or {}
                left_out[i] = True
                self._join_if_agreeing(i, child, meta)
        if left_out is None:
            self._bound = self._loaders = self._savers = self._all
        else:
            self._bound = [c for c in self._all if left_out.get(c[0], True)]
            self._loaders = self._savers = [c for c in self._all if c[0] not in left_out]
            for i in left_out:
                self._lose_loads(i)
        if self._per_layer:
            self._pick_layer_calls()

    def _join_if_agreeing(self, i: int, child: Any, meta: Any) -> None:
        """A child left out of this step on this rank only, that agrees its loads with
        the other ranks (a collective): it joins them all the same, in ``start_loads``."""
        if self._caps[i].agrees_across_ranks:
            self._joiners[i] = meta

    def _expect(self, plan: MuxStepPlan) -> None:
        for req_id, children in plan.async_loaders.items():
            if children:
                self.recving.expect(req_id, children)
            else:
                self._done_recving.add(req_id)
        if self.per_request_failures:
            for req_id in plan.failed_loads:
                self.recving.fail(req_id)
        for req_id, children in plan.async_savers.items():
            self.sending.expect(req_id, children)

    def _pick_layer_calls(self) -> None:
        """The per-layer hooks of this step: live children whose layer hooks do work, less
        those that say they have none this step (``_quiet_layer_children``).

        A child whose breaker is not closed (half-open: this is its trial) goes through
        its guard (``_Trial``), so that a success closes the breaker.
        """
        quiet = self._quiet_layer_children()
        if not quiet and self._loaders is self._all and self._savers is self._all:
            for _, _, guard in self._per_layer:
                if not guard.closed:
                    break
            else:  # every child live, every breaker closed: the usual step
                self.layer_loads = self._every_layer_load
                self.layer_saves = self._every_layer_save
                return
        loaders = {c[0] for c in self._loaders}
        savers = {c[0] for c in self._savers}
        loads: list[LayerCall] = []
        saves: list[LayerCall] = []
        for i, child, guard in self._per_layer:
            if i in quiet:
                continue
            callee = child if guard.closed else _Trial(self, i, child)
            if i in loaders and i in self._layer_loaders:
                loads.append((i, callee))
            if i in savers and i in self._layer_savers:
                saves.append((i, callee))
        self.layer_loads, self.layer_saves = loads, saves

    def _quiet_layer_children(self) -> frozenset[int]:
        """Children with per-layer hooks that say they have no per-layer work this step
        (``layer_work_by_step``: their ``has_connector_metadata`` tells)."""
        if not self._asked:
            return _NO_CHILDREN
        return frozenset(i for i, child, _ in self._asked if not _has_layer_work(child))

    def trial(self, i: int, hook: str, method: Callable[..., Any], *args: Any, **kw: Any) -> None:
        """A per-layer hook of a child whose breaker is not closed, through its guard."""
        if self.guards[i].invoke(hook, method, args, _FAILED, kwargs=kw) is _FAILED:
            self._layer_failed(i, hook)

    def _lose_loads(self, i: int) -> None:
        """Child ``i`` will not load this step: its blocks are errors, its async loads fail."""
        if i in self._lost:
            return
        self._lost.add(i)
        lost = self._step.load_blocks.get(i)
        if lost is None and i in self._step.load_blocks:  # its metadata names them
            lost = self.children[i].mux_load_blocks(self._metas[i])
        if lost:
            self.guards[i].note("load_errors", len(lost))
            self._load_errors.update(lost)
        if self._step.async_loaders:
            owed = [r for r, children in self._step.async_loaders.items() if i in children]
            self._done_recving |= self.recving.report(i, owed, failed=True)

    def _load_failed(self, i: int) -> None:
        """Child ``i`` failed a load hook: it neither loads nor saves for the rest of the step."""
        self._lose_loads(i)
        self._loaders = [c for c in self._loaders if c[0] != i]
        self._savers = [c for c in self._savers if c[0] != i]
        if self._per_layer:
            self._pick_layer_calls()

    def _save_failed(self, i: int) -> None:
        """Child ``i`` failed a save hook: its saves of the step are dropped."""
        self._savers = [c for c in self._savers if c[0] != i]
        self.guards[i].note("save_errors")
        if self._per_layer:
            self._pick_layer_calls()

    def start_loads(self, forward_context: Any, kwargs: dict[str, Any]) -> None:
        """``start_load_kv`` on every child loading this step, timed; in the children's
        order, a child that agrees with the other ranks joins them even if left out."""
        clock = time.perf_counter
        started = clock()  # each child's time ends where the next one's starts
        loading = {c[0] for c in self._loaders}
        for i, child, guard in self._all:
            if i in self._joiners:
                self._join(i, child)
                started = clock()
                continue
            if i not in loading:
                continue
            agrees = self._caps[i].agrees_across_ranks
            if not guard.closed and not agrees:  # an agreeing child runs on every rank
                args = (forward_context,)
                method = child.start_load_kv
                outcome = guard.invoke(
                    "start_load_kv", method, args, _FAILED, "load_seconds", kwargs
                )
                if outcome is _FAILED:
                    self._load_failed(i)
                started = clock()
                continue
            try:
                child.start_load_kv(forward_context, **kwargs)
            except Exception as exc:
                guard.fail("start_load_kv", exc)
                self._load_failed(i)
            ended = clock()
            guard.load_seconds += ended - started
            started = ended

    def _join(self, i: int, child: Any) -> None:
        try:
            child.mux_join_agreement(self._joiners[i])
        except Exception as exc:
            self.guards[i].fail("mux_join_agreement", exc)

    def layer_failed(self, i: int, hook: str, exc: Exception) -> None:
        """Child ``i`` raised ``exc`` in a per-layer hook (a loop over ``layer_loads`` or
        ``layer_saves`` calls each child's hook, guarded, and comes here if it raised)."""
        self.guards[i].fail(hook, exc)
        self._layer_failed(i, hook)

    def _layer_failed(self, i: int, hook: str) -> None:
        if hook == "save_kv_layer":
            self._save_failed(i)
        else:
            self._load_failed(i)

    def save(self) -> None:
        """Settle the loads (``settle_loads``), then ``wait_for_save`` on every child saving
        this step, timed; a failure drops the child's saves."""
        if self._droppers and (self._load_errors or (self._step.load_blocks and self._siblings)):
            self.settle_loads()
        clock = time.perf_counter
        started = clock()  # each child's time ends where the next one's starts
        for i, child, guard in self._savers:
            if not guard.closed:
                method = child.wait_for_save
                if guard.invoke("wait_for_save", method, (), _FAILED, "save_seconds") is _FAILED:
                    self._save_failed(i)
                started = clock()
                continue
            try:
                child.wait_for_save()
            except Exception as exc:
                guard.fail("wait_for_save", exc)
                self._save_failed(i)
            ended = clock()
            guard.save_seconds += ended - started
            started = ended

    def end_step(self) -> None:
        """Unbind every child that was bound."""
        for _, child, guard in self._bound:  # even past an open breaker: no stale metadata
            try:
                child.clear_connector_metadata()
            except Exception as exc:
                guard.fail("clear_connector_metadata", exc)
        self._bound = self._loaders = self._savers = _NONE
        self.layer_loads = self.layer_saves = _NO_LAYER_CALLS

    def transfer_results(
        self,
        finished_req_ids: set[str],
        into: TransferResult,
        checkpoints: dict[str, Any] | None = None,
    ) -> None:
        """Each request finished once, after every child that owes it reported: added to
        ``into`` (sending, recving, failed recving); the prefix replay checkpoints that go
        out with those receives (vLLM main) to ``checkpoints``."""
        sending, recving, failed_into = into
        if self._done_recving:
            recving |= self._done_recving
            self._done_recving = set()
        for i, child, guard in self._all:
            try:  # never skipped: only the child knows when its transfers end
                result = child.get_transfer_results(finished_req_ids)
                failed_recving, finished_recving = result.failed_recving, result.finished_recving
                finished_sending = result.finished_sending
                found = getattr(result, "prefix_replay_checkpoints", None)  # vLLM main
                if found:
                    self._note_checkpoints(i, found)
            except Exception as exc:  # what it owes waits: its threads may still use it
                guard.fail("get_transfer_results", exc)
                self._hold(i)
                continue
            if failed_recving:
                failed = set(failed_recving)
                recving |= self.recving.report(i, failed, failed=True)
                recving |= self.recving.report(i, set(finished_recving) - failed)
            elif finished_recving:
                recving |= self.recving.report(i, finished_recving)
            if finished_sending:
                sending |= self.sending.report(i, finished_sending)
        if self._holding:
            self._give_up(sending, recving)
        if sending:
            self.sending.take_failed(sending)  # a failed save is only a future miss
        if recving:
            failed_into |= self.recving.take_failed(recving)
        if self._checkpoints:
            self._release_checkpoints(finished_req_ids, recving, failed_into, checkpoints)

    def _note_checkpoints(self, i: int, found: Mapping[str, Any]) -> None:
        """Keep child ``i``'s prefix replay checkpoints until their requests' receives."""
        for req_id, checkpoint in found.items():
            self._checkpoints.setdefault(req_id, {})[i] = checkpoint

    def _release_checkpoints(
        self,
        finished: set[str],
        recving: set[str],
        failed: set[str],
        into: dict[str, Any] | None,
    ) -> None:
        """Send a checkpoint with its receive if that did not fail and no child's differs."""
        pending = self._checkpoints
        for req_id in [r for r in pending if r in recving or r in finished]:
            found = list(pending.pop(req_id).values())
            agreed = all(checkpoint == found[0] for checkpoint in found)
            if into is not None and agreed and req_id in recving and req_id not in failed:
                into[req_id] = found[0]

    def _hold(self, i: int) -> None:
        """Child ``i``'s results call raised: hold what it owes, its loads failed.

        Its report of this call is lost, and a thread of the child may still write the
        blocks of a load (or read those of a save): finished, they would go to vLLM, to be
        read, freed or handed to another request. So each stays owed until the child
        reports it (its loads recomputed all the same: the lost report may have held
        their failure), or until ``give_up_seconds`` after the first failure it was held
        in (``_give_up``), so that a child that stays broken does not keep them for ever.
        """
        until = self._clock() + self._give_up_seconds
        self.recving.hold(i, until, failed=True)
        self.sending.hold(i, until)
        self._holding = self.recving.holding or self.sending.holding

    def _give_up(self, sending: set[str], recving: set[str]) -> None:
        """Held loads and saves past their bound count as finished by their child (loads
        failed: vLLM recomputes them, without reading their blocks)."""
        now = self._clock()
        for tracker, into, kind in (
            (self.recving, recving, "loads"),
            (self.sending, sending, "saves"),
        ):
            done, released = tracker.release_expired(now)
            into |= done
            for i, count in released.items():
                log.error(
                    "kvmux mux: child %s did not report %d %s within %.0f s of its failed "
                    "results call; finishing them without it",
                    self.guards[i].label,
                    count,
                    kind,
                    self._give_up_seconds,
                )
        self._holding = self.recving.holding or self.sending.holding

    def _gather_load_errors(self, children: Sequence[Child]) -> set[int]:
        """``children``'s load errors so far, added to the mux's own; returns them all."""
        return _add_load_errors(children, self._load_errors)

    def settle_loads(self) -> None:
        """Before any child saves: tell kvmux tiers which blocks failed to load in any child.

        The forward pass computed later blocks over those, so no tier may save them; the
        engine recomputes them and they are saved then. Only this step's loaders are asked,
        and ``save`` skips this where it cannot matter (no kvmux tier; or no load of a
        sibling and none failed for the mux): every child's load errors are gathered
        afterwards anyway, in ``load_errors``.
        """
        loading = self._step.load_blocks
        failed = self._gather_load_errors([c for c in self._all if c[0] in loading])
        if not failed:
            return
        for i, child, guard in self._savers:
            if self._caps[i].drops_saves:
                try:
                    child.mux_drop_saves_over(set(failed))
                except Exception as exc:
                    guard.fail("mux_drop_saves_over", exc)

    def load_errors(self) -> set[int]:
        """Blocks that failed to load this step, from any child or from the mux itself
        (with per-request failures: the children's only; the mux fails the requests)."""
        errors, self._load_errors = self._load_errors, set()
        if self.per_request_failures:
            errors = set()
        return _add_load_errors(self._all, errors)


def _has_layer_work(child: Any) -> bool:
    """A declaring child's answer for this step; yes if it cannot answer (its hooks are
    then called, and fail there if they do)."""
    try:
        return bool(child.has_connector_metadata())
    except Exception:
        return True


def _add_load_errors(children: Sequence[Child], errors: set[int]) -> set[int]:
    """Each child's ``get_block_ids_with_load_errors`` added to ``errors`` (guarded)."""
    for _, child, guard in children:
        try:
            found = child.get_block_ids_with_load_errors()
        except Exception as exc:
            guard.fail("get_block_ids_with_load_errors", exc)
            continue
        if found:
            errors.update(found)
    return errors
