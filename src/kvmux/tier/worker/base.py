"""What every worker-side tier shares: a step's load bookkeeping and what a save must skip.

``StoreWorker`` (``tier/worker/store_worker.py``) moves blocks to and from a byte store;
``SlabWorker`` (``tier/worker/slab_worker.py``) to and from preallocated host slots.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence

import torch

from kvmux.keys import BlockKey
from kvmux.metrics import TierStats
from kvmux.tier.fences import InFlightSaves
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, TierStepPlan
from kvmux.tier.worker.loader import AsyncLoader, FinishedLoads
from kvmux.tier.worker.transfer import CopyStream

__all__ = ["RankAgreement", "WorkerBase"]

# every rank's answer to "did each of this step's loads land here?": landed on all ranks
RankAgreement = Callable[[Sequence[bool]], list[bool]]

log = logging.getLogger(__name__)


class WorkerBase(ABC):
    """Moves blocks between one tier and the engine's KV cache for one rank."""

    name: str  # the tier's name, in logs and thread names

    def __init__(self, name: str, rank: int, stats: TierStats):
        self.name = name
        self._rank = rank
        self._stats = stats
        # one loader thread reads a request's blocks in turn: reader threads would only
        # take more of the cores the forward pass runs on
        self._loader = AsyncLoader(self._load_async_batch, self._bytes_of, name)
        self._lock = threading.Lock()  # guards _missing and what subclasses say it guards
        self._load_errors: set[int] = set()
        self._failed_this_step: set[int] = set()  # blocks whose load failed, until the save
        self._missing: set[BlockKey] = set()
        self._warned: set[str] = set()
        self._in_flight = InFlightSaves()  # saves whose copies a device may still run
        self._copies: CopyStream | None = None  # where loads' copies run, once registered
        self._agreement: RankAgreement | None = None  # tensor parallelism: see agree_with_ranks

    @property
    def agrees_with_ranks(self) -> bool:
        """Whether ``load`` runs a collective with the other tensor-parallel ranks."""
        return self._agreement is not None

    def _agree(self, loads: Sequence[BlockTransfer]) -> list[bool]:
        """Load, then agree with the other ranks, even if the load raised (re-raised after)."""
        assert self._agreement is not None
        error: Exception | None = None
        try:
            landed = self._load_blocks(loads)
        except Exception as exc:
            error, landed = exc, [False] * len(loads)
        agreed = self._agreement(landed)
        overruled = sum(
            mine and not all_ranks for mine, all_ranks in zip(landed, agreed, strict=True)
        )
        if overruled:  # landed here, failed on another rank: recomputed, counted as failed
            self._stats.add(loaded_blocks=-overruled, load_errors=overruled)
        landed = agreed
        if error is not None:
            failed = {t.block_id for t in loads}
            self._load_errors |= failed
            self._failed_this_step |= failed
            raise error
        return landed

    def join_agreement(self, loads: Sequence[BlockTransfer]) -> None:
        """A rank that cannot load this step (or was left out of it) still joins the
        collective, with every load failed: the others wait for it, and fail them too."""
        if self._agreement is None or not loads:
            return
        self._agreement([False] * len(loads))
        failed = {t.block_id for t in loads}
        self._load_errors |= failed
        self._failed_this_step |= failed

    def agree_with_ranks(self, agreement: RankAgreement) -> None:
        """Under tensor parallelism: a block whose load failed on any rank failed on every
        rank (the all-reduce spread it), so none saves what was computed over it."""
        self._agreement = agreement

    @abstractmethod
    def register(
        self,
        kv_caches: dict[str, torch.Tensor],
        num_blocks: int | None,
        groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """Adopt the engine's KV cache tensors; ``groups``: each KV cache group's layers.

        Without ``groups`` every layer is in one group. A group's entry holds its layers
        in the order of ``kv_caches``.
        """

    @abstractmethod
    def _load_blocks(self, transfers: Sequence[BlockTransfer]) -> list[bool]:
        """Copy each block in before the forward pass; whether each landed (failures counted)."""

    def _load_async_batch(self, transfers: Sequence[BlockTransfer]) -> list[bool]:
        """A batch of an asynchronous load, on a loader thread (``_load_blocks`` by default)."""
        return self._load_blocks(transfers)

    @abstractmethod
    def _bytes_of(self, transfer: BlockTransfer) -> int:
        """Host bytes of one block of the transfer's group."""

    @abstractmethod
    def save(self, plan: TierStepPlan) -> None:
        """Save the planned blocks (evicting the planned keys first) after the forward pass."""

    @abstractmethod
    def flush(self) -> None:
        """Wait until every save made so far is in the tier."""

    @abstractmethod
    def clear(self) -> None:
        """Drop everything the tier holds."""

    def close(self) -> None:
        """Stop loads and release threads."""
        self._loader.close()
        if self._copies is not None:
            self._copies.close()

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        level = logging.WARNING if kind not in self._warned else logging.DEBUG
        self._warned.add(kind)
        log.log(level, message, *args)

    # -- loads ---------------------------------------------------------------

    def load(self, loads: Sequence[BlockTransfer]) -> None:
        """Copy every planned block into the KV cache before the forward pass."""
        self._failed_this_step = set()  # a new step: what failed before is settled
        if not loads:
            return
        if not self.registered:  # the other ranks still wait in the collective
            self.join_agreement(loads)
            return
        # under an agreement every rank has this step's loads: every rank reaches it
        landed = self._load_blocks(loads) if self._agreement is None else self._agree(loads)
        failed = {t.block_id for t, ok in zip(loads, landed, strict=True) if not ok}
        self._load_errors |= failed
        self._failed_this_step |= failed

    @property
    def copies_by_layer(self) -> bool:
        """Whether loads are copied layer by layer (``wait_layer`` then waits)."""
        return False

    def wait_layer(self, layer_name: str) -> None:
        """Return once ``layer_name``'s loaded blocks are in (``load`` copies them all)."""
        return

    def finish_layers(self) -> None:
        """Settle this step's loads that were copied layer by layer (none here)."""
        return

    @property
    @abstractmethod
    def registered(self) -> bool:
        """Whether the KV cache is registered (nothing moves before)."""

    def start_loads(self, loads: Sequence[RequestLoad], idle: bool = False) -> None:
        """Start each request's load on a loader thread; ``finished_loads`` reports it.

        ``idle``: this step runs no forward pass, so loads are not paced (``StepBudget``).
        """
        self._loader.begin_step(idle)
        self._loader.start(loads)

    def finished_loads(
        self, finished_req_ids: Iterable[str] = (), idle: bool = False
    ) -> FinishedLoads:
        """Asynchronous loads that ended since the last call, each request exactly once.

        ``finished_req_ids`` are requests the engine finished or aborted: their loads
        stop at the next batch, and their failures are not reported (nothing runs on them).
        In an ``idle`` step this waits briefly for a load to end (``AsyncLoader.finished``).
        """
        return self._loader.finished(finished_req_ids, idle)

    def take_load_errors(self) -> set[int]:
        """Block ids that failed to load since the last call."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _report_missing(self, keys: Iterable[BlockKey]) -> None:
        """Keys the tier does not hold after all (from any thread): the index forgets them."""
        with self._lock:
            self._missing.update(keys)

    def take_missing(self) -> set[BlockKey]:
        """Block keys the tier could not serve, or never got, since the last call."""
        with self._lock:
            missing, self._missing = self._missing, set()
        return missing

    # -- saves ---------------------------------------------------------------

    def _use_copies(self, copies: CopyStream, host_block_bytes: int | None) -> None:
        """The KV cache is registered: where loads' copies run (see ``AsyncLoader.use``)."""
        self._copies = copies
        self._loader.use(copies, host_block_bytes)

    def fence(self, plan: TierStepPlan) -> None:
        """Before the step submits anything: order every stream that writes the KV cache
        after in-flight saves of blocks it may overwrite, on the device (the host does
        not wait; ``kvmux.tier.fences``; nothing is in flight on the host)."""
        if self._in_flight:
            streams = self._copies.writers() if self._copies is not None else []
            self._in_flight.before_step(plan.step, plan.fence, streams)

    def drop_saves_over(self, block_ids: Iterable[int]) -> None:
        """Blocks another connector failed to load this step: do not save what used them."""
        self._failed_this_step.update(block_ids)

    def _untainted(self, plan: TierStepPlan) -> list[BlockTransfer]:
        """The planned saves, less blocks computed over a block that failed to load."""
        failed, self._failed_this_step = self._failed_this_step, set()
        if not failed:
            return plan.saves
        tainted = plan.blocks_computed_over(failed)
        dropped = [t for t in plan.saves if t.block_id in tainted]
        if dropped:
            self._report_missing(t.key for t in dropped)  # the scheduler's index forgets them
            self._stats.add(tainted_saves=len(dropped))
        return [t for t in plan.saves if t.block_id not in tainted]
