"""MuxConnector's worker half: runs children's hooks in isolation, finishes exactly once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kvmux.mux.accounting import FinishTracker
from kvmux.mux.guard import ChildGuard, succeeded
from kvmux.mux.plan import MuxStepPlan

__all__ = ["MuxWorker", "TransferResult"]

log = logging.getLogger("kvmux.mux")
_FAILED: Any = object()  # what a guarded hook returns when the child raised or was skipped
TransferResult = tuple[set[str], set[str], set[str]]  # sending, recving, failed recving


class MuxWorker:
    """Step state of the worker side: which children are live, what failed, who owes what."""

    def __init__(
        self,
        children: Sequence[Any],
        guards: Sequence[ChildGuard],
        give_up_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.children = children
        self.guards = guards
        self._give_up_seconds = give_up_seconds  # how long a failing child's sends are held
        self._clock = clock
        self._silent_since: dict[int, float] = {}  # child -> when its reports started failing
        self.recving = FinishTracker()
        self.sending = FinishTracker()
        self._step = MuxStepPlan()
        self._loading = [False] * len(children)  # child takes part in this step's loads
        self._saving = [False] * len(children)  # child takes part in this step's saves
        self._bound = [False] * len(children)  # child holds this step's metadata
        # children whose per-layer hooks do work (kvmux tiers copy whole steps instead)
        self._layer_hooks = [bool(getattr(c, "kvmux_layer_hooks", True)) for c in children]
        self._load_errors: set[int] = set()
        self._done_recving: set[str] = set()

    def begin_step(self, plan: MuxStepPlan, child_metas: Sequence[Any | None]) -> None:
        """Bind each live child's metadata; children left out lose their loads."""
        self._step = plan
        self._load_errors.update(plan.failed_blocks)
        for req_id, children in plan.async_loaders.items():
            if children:
                self.recving.expect(req_id, children)
            else:
                self._done_recving.add(req_id)
        for req_id, children in plan.async_savers.items():
            self.sending.expect(req_id, children)
        for i, (child, meta) in enumerate(zip(self.children, child_metas, strict=True)):
            bound = meta is not None and self.guards[i].call(
                "bind_connector_metadata",
                succeeded(child.bind_connector_metadata, meta),
                False,
                always=True,  # a cut-off child still sees its step (preemptions, its plan)
            )
            cut_off = i in plan.cut_off or self.guards[i].cut_off()
            if bound and cut_off:
                self.guards[i].counters["skipped_calls"] += 1
            self._bound[i] = bool(bound)
            self._loading[i] = self._saving[i] = bool(bound) and not cut_off
            if not self._loading[i]:
                self._lose_loads(i)

    def _lose_loads(self, i: int) -> None:
        """Child ``i`` will not load this step: its blocks are errors, its async loads fail."""
        self._loading[i] = False
        lost = self._step.load_blocks.pop(i, [])
        self.guards[i].counters["load_errors"] += len(lost)
        self._load_errors.update(lost)
        owed = [r for r, children in self._step.async_loaders.items() if i in children]
        self._done_recving |= self.recving.report(i, owed, failed=True)

    def each_loading(
        self,
        hook: str,
        args: tuple[Any, ...],
        per_layer: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Run a load hook on every child still loading this step."""
        timer = None if per_layer else "load_seconds"
        for i, child in enumerate(self.children):
            if self._loading[i] and (self._layer_hooks[i] or not per_layer):
                method = getattr(child, hook)
                outcome = self.guards[i].invoke(hook, method, args, _FAILED, timer, kwargs)
                if outcome is _FAILED:
                    self._lose_loads(i)
                    self._saving[i] = False

    def each_saving(
        self,
        hook: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        per_layer: bool = False,
    ) -> None:
        """Run a save hook on every child still saving this step; a failure drops its saves."""
        timer = None if per_layer else "save_seconds"
        for i, child in enumerate(self.children):
            if self._saving[i] and (self._layer_hooks[i] or not per_layer):
                method = getattr(child, hook)
                outcome = self.guards[i].invoke(hook, method, args, _FAILED, timer, kwargs)
                if outcome is _FAILED:
                    self._saving[i] = False
                    self.guards[i].counters["save_errors"] += 1

    def end_step(self) -> None:
        """Unbind every child that was bound."""
        for i, child in enumerate(self.children):
            if self._bound[i]:  # even past an open breaker: the child must not keep stale metadata
                try:
                    child.clear_connector_metadata()
                except Exception as exc:
                    self.guards[i].fail("clear_connector_metadata", exc)
        self._loading = [False] * len(self.children)
        self._saving = [False] * len(self.children)
        self._bound = [False] * len(self.children)

    def transfer_results(self, finished_req_ids: set[str]) -> TransferResult:
        """Each request finished once, after every child that owes it reported."""
        sending: set[str] = set()
        recving, self._done_recving = self._done_recving, set()
        for i, child in enumerate(self.children):
            result = self.guards[i].call(
                "get_transfer_results",
                partial(child.get_transfer_results, finished_req_ids),
                None,
                always=True,  # never skipped: only the child knows when its transfers end
            )
            if result is None:  # it raised: its loads are failed (recomputed)
                recving |= self.recving.abandon_child(i)
                sending |= self._sends_given_up(i)
                continue
            self._silent_since.pop(i, None)
            failed = set(result.failed_recving)
            recving |= self.recving.report(i, failed, failed=True)
            recving |= self.recving.report(i, set(result.finished_recving) - failed)
            sending |= self.sending.report(i, result.finished_sending)
        self.sending.take_failed(sending)  # a failed save is only a future miss
        return sending, recving, self.recving.take_failed(recving)

    def _sends_given_up(self, i: int) -> set[str]:
        """Sends of a child that cannot report: held until it has failed for a while.

        Releasing them at once could let the engine reuse blocks the child still reads;
        holding them for ever would leak those blocks if the child never comes back.
        """
        now = self._clock()
        since = self._silent_since.setdefault(i, now)
        if now - since < self._give_up_seconds:
            return set()
        given_up = self.sending.abandon_child(i)
        if given_up:
            log.error(
                "kvmux mux: child %s reported no transfers for %.0f s; releasing %d requests",
                self.guards[i].label,
                now - since,
                len(given_up),
            )
        return given_up

    def _gather_load_errors(self) -> set[int]:
        """Every child's load errors so far, added to the mux's own; returns them all."""
        for i, child in enumerate(self.children):
            self._load_errors |= self.guards[i].call(
                "get_block_ids_with_load_errors",
                child.get_block_ids_with_load_errors,
                set(),
                always=True,
            )
        return self._load_errors

    def settle_loads(self) -> None:
        """Before any child saves: tell kvmux tiers which blocks failed to load in any child.

        The forward pass computed later blocks over those, so no tier may save them; the
        engine recomputes them and they are saved then.
        """
        failed = self._gather_load_errors()
        if not failed:
            return
        for i, child in enumerate(self.children):
            drop = getattr(child, "kvmux_drop_saves_over", None)
            if drop is not None and self._saving[i]:
                call = partial(drop, set(failed))
                self.guards[i].call("kvmux_drop_saves_over", call, None, always=True)

    def load_errors(self) -> set[int]:
        """Blocks that failed to load this step, from any child or from the mux itself."""
        errors = self._gather_load_errors()
        self._load_errors = set()
        return errors
