"""MuxConnector's scheduler half: asks children, picks loaders, counts finishes. No vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from kvmux.errors import KvmuxError
from kvmux.mux.guard import ChildGuard, succeeded
from kvmux.mux.plan import MuxStepPlan
from kvmux.policies.selection import Contribution, Offer, select

__all__ = ["MuxScheduler", "TransferParamsClash"]


class TransferParamsClash(KvmuxError):
    """Two children returned the same kv_transfer_params key."""


def _blocks_of(contribution: Contribution, block_ids: Sequence[int], block_size: int) -> list[int]:
    first = contribution.start // block_size
    last = -(-contribution.end // block_size)
    return list(block_ids[first:last])


class MuxScheduler:
    """Per-request load plans over the children, and what the workers must expect."""

    def __init__(
        self,
        children: Sequence[Any],
        guards: Sequence[ChildGuard],
        policy: str,
        offset_capable: Sequence[bool],
        block_size: int,
    ):
        self.children = children
        self.guards = guards
        self.policy = policy
        self.offset_capable = offset_capable
        self.block_size = block_size
        self._plans: dict[str, list[Contribution]] = {}
        self._step = MuxStepPlan()

    def lookup(self, request: Any, num_computed: int) -> tuple[int | None, bool]:
        """Tokens the children can load together, per the policy; None while one looks."""

        def ask(i: int, start: int) -> Offer | None:
            guard = self.guards[i]
            guard.counters["lookups"] += 1
            miss: tuple[int | None, bool] = (0, False)
            call = partial(self.children[i].get_num_new_matched_tokens, request, start)
            tokens, is_async = guard.call("get_num_new_matched_tokens", call, miss)
            return None if tokens is None else Offer(start, int(tokens), bool(is_async))

        plan = select(self.policy, ask, self.offset_capable, num_computed, self.block_size)
        if plan is None:
            return None, False
        self._plans[request.request_id] = plan
        return sum(c.tokens for c in plan), any(c.is_async for c in plan)

    def contributions(self, req_id: str) -> list[Contribution]:
        """The current load plan of a request."""
        return self._plans.get(req_id, [])

    def _trim(self, plan: list[Contribution], allowed: int) -> list[Contribution]:
        trimmed, left = [], allowed
        for c in plan:
            if left <= 0:
                break
            trimmed.append(Contribution(c.child, c.start, min(c.tokens, left), c.is_async))
            left -= c.tokens
        return trimmed

    def after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Tell each child its share of the load; note block ownership for the workers."""
        req_id = request.request_id
        plan = self._trim(self._plans.get(req_id, []), num_external_tokens)
        share = {c.child: c for c in plan}
        block_ids = blocks.get_block_ids()[0] if plan else []
        failed: set[int] = set()
        for i, child in enumerate(self.children):
            cut_off = self.guards[i].cut_off()  # opened since the lookup: it loads nothing
            tokens = share[i].tokens if i in share and not cut_off else 0
            told = self.guards[i].call(  # always told, so no child keeps a stale lookup
                "update_state_after_alloc",
                succeeded(child.update_state_after_alloc, request, blocks, tokens),
                False,
                always=True,
            )
            if i not in share:
                continue
            owned = _blocks_of(share[i], block_ids, self.block_size)
            if told and not cut_off:
                self.guards[i].counters["hit_tokens"] += tokens
                self._step.load_blocks.setdefault(i, []).extend(owned)
            else:
                failed.add(i)
                self._step.failed_blocks.extend(owned)
        if any(c.is_async for c in plan):
            loaders = {c.child for c in plan if c.is_async and c.child not in failed}
            self._step.async_loaders[req_id] = loaders
        self._plans[req_id] = plan

    def take_step(self, child_metas: Sequence[Any | None]) -> MuxStepPlan:
        """This step's plan; a child whose metadata failed, or that is cut off, loses its loads.

        A cut-off child still built its metadata and its workers still bind it (nothing
        it planned outlives the step), but they run none of its loads or saves.
        """
        step, self._step = self._step, MuxStepPlan()
        for i, meta in enumerate(child_metas):
            if meta is None or self.guards[i].cut_off():
                step.fail_child(i)
                step.cut_off.add(i)
        return step

    def finished(
        self, req_id: str, results: Sequence[tuple[bool, dict[str, Any] | None]]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Aggregate the children's request_finished answers."""
        self._plans.pop(req_id, None)
        savers = {i for i, (is_async, _) in enumerate(results) if is_async}
        merged: dict[str, Any] | None = None
        owner: dict[str, int] = {}
        for i, (_, params) in enumerate(results):
            for key, value in (params or {}).items():
                if key in owner:
                    raise TransferParamsClash(
                        f"kv_transfer_params key {key!r} set by both child "
                        f"{self.guards[owner[key]].label} and child {self.guards[i].label}"
                    )
                owner[key] = i
                merged = merged or {}
                merged[key] = value
        if savers:
            self._step.async_savers[req_id] = savers
        return bool(savers), merged
