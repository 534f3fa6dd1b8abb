"""MuxScheduler over a single child: the same answers, without the loops over children.

A mux of one child is how most users start (one tier, or a foreign connector behind the
mux's failure isolation and stats). Its scheduler hooks run for every request and every
step, so they skip what only several children need: the loop, the best-offer bookkeeping,
the merge of several answers. Anything unusual (a policy that asks child after child, a
plan of several pieces) goes to the general path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvmux.mux.plan import EMPTY_STEP, MuxStepPlan
from kvmux.mux.scheduler import MuxScheduler
from kvmux.policies.selection import Contribution

__all__ = ["SoleChildScheduler", "scheduler_class"]

_new = tuple.__new__  # Contribution(...) without NamedTuple's Python-level __new__


class SoleChildScheduler(MuxScheduler):
    """MuxScheduler specialised for one child."""

    def lookup(self, request: Any, num_computed: int) -> tuple[int | None, bool]:
        """What the child offers from the computed tokens on; None while it looks."""
        if self._cap is None:
            return super().lookup(request, num_computed)
        tokens, is_async = self._answer(0, request, num_computed)
        if tokens is None:
            return None, False
        if tokens and not is_async and self.async_only:
            tokens = self._decline(0)
        if not tokens:
            if self.plans:
                self.plans.pop(request.request_id, None)
            return 0, False
        self.plans[request.request_id] = [_new(Contribution, (0, num_computed, tokens, is_async))]
        return tokens, is_async

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Tell the child its load (0 if none, or if its breaker opened since the lookup)."""
        plan = self.plans.get(request.request_id) if self.plans else None
        if plan and len(plan) > 1:
            super().after_alloc(request, blocks, num_external_tokens)
            return
        child, guard = self._pairs[0]
        if not plan or num_external_tokens <= 0:
            if plan:  # allocated without the external tokens: nothing loads
                del self.plans[request.request_id]
            try:
                child.update_state_after_alloc(request, blocks, 0)
            except Exception as exc:
                guard.fail("update_state_after_alloc", exc)
            return
        _, start, tokens, is_async = plan[0]
        if tokens > num_external_tokens:
            tokens = num_external_tokens
            self.plans[request.request_id] = [Contribution(0, start, tokens, is_async)]
        cut_off = not guard.closed and guard.cut_off()
        loads = False
        try:
            child.update_state_after_alloc(request, blocks, 0 if cut_off else tokens)
            loads = not cut_off
        except Exception as exc:
            guard.fail("update_state_after_alloc", exc)
        self._note_load(request.request_id, blocks, 0, start, tokens, is_async, loads)

    def take_step(self, child_metas: Sequence[Any | None]) -> MuxStepPlan:
        """This step's plan; the child's loads fail if its metadata failed or it is cut off."""
        guard = self.guards[0]
        if child_metas[0] is None or (not guard.closed and guard.cut_off()):
            return super().take_step(child_metas)
        step, self._step = self._step, None
        if self._unread:
            self._unread = []
        return EMPTY_STEP if step is None else step

    def finished(
        self, req_id: str, results: Sequence[tuple[bool, dict[str, Any] | None]]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The child's request_finished answer, its async save expected by the workers."""
        if self.plans:
            self.plans.pop(req_id, None)
        is_async, params = results[0]
        merged = dict(params) if params else None
        if is_async:
            self._current().expect_savers(req_id, {0})
            return True, merged
        return False, merged


def scheduler_class(children: int) -> type[MuxScheduler]:
    """The scheduler half for this many children: specialised when there is only one."""
    return SoleChildScheduler if children == 1 else MuxScheduler
