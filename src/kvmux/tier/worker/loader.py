"""Asynchronous loads: each request's blocks read, verified and copied in off the forward path.

vLLM holds a request whose load is asynchronous back (``WAITING_FOR_REMOTE_KVS``) until
the workers report it finished; meanwhile the engine keeps stepping the other requests.
The blocks a load writes belong to that waiting request alone, so its copies can run
while a forward pass reads other blocks of the same KV cache. A load ends reported
whatever happens: a request left waiting for ever would hold its blocks for ever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad
from kvmux.tier.worker.transfer import CopyStream, on_this_device

__all__ = ["AsyncLoader", "FinishedLoads", "StepBudget"]

log = logging.getLogger(__name__)
LOADERS = 2  # requests loading at once
LOAD_BATCH = 8  # blocks read at a time (bounds the bytes held; an abort stops between batches)
HOST_STEP_BYTES = 4 * 2**20  # into host memory: bytes copied in per engine step (see StepBudget)
IDLE_WAIT_SECONDS = 0.02  # an idle engine step waits at most this long for a load to end

LoadBlocks = Callable[[Sequence[BlockTransfer]], list[bool]]  # whether each block landed
SizeOf = Callable[[BlockTransfer], int]  # host bytes of a block
Position = Sequence[BlockTransfer]  # every group's block at one position


def _flat(positions: Sequence[Position]) -> list[BlockTransfer]:
    return [t for position in positions for t in position]


@dataclass
class FinishedLoads:
    """Asynchronous loads that ended since the last report, each request once."""

    finished: set[str] = field(default_factory=set)  # every request whose load ended
    failed: dict[str, int] = field(default_factory=dict)  # request -> first position that failed
    failed_blocks: set[int] = field(default_factory=set)  # block ids that did not load


@dataclass
class _Ended:
    """How one request's load ended."""

    req_id: str
    failed_at: int | None = None  # position (block index in the prompt) of the first failure
    failed_blocks: set[int] = field(default_factory=set)

    def fail(self, position: int, blocks: Iterable[int]) -> None:
        self.failed_at = position if self.failed_at is None else min(self.failed_at, position)
        self.failed_blocks.update(blocks)


class StepBudget:
    """Bytes the loaders may copy in per engine step; unlimited without ``per_step``.

    A CPU engine's KV cache is host memory: loads share the cores and the memory
    bandwidth with the forward pass. Spread over the engine's steps, they slow every step
    a little instead of a few steps a lot. An engine with nothing else to run steps
    without a forward pass, so loads then go at full speed.
    """

    def __init__(self, per_step: int | None = None):
        self._per_step = per_step
        self._available = per_step or 0
        self._unpaced = False  # an idle step: no forward pass to share the cores with
        self._changed = threading.Condition()

    def unpace(self, unpaced: bool) -> None:
        """Whether this step runs no forward pass: then loads are not paced."""
        with self._changed:
            self._unpaced = unpaced
            self._changed.notify_all()

    def refill(self) -> None:
        """A new engine step: its share of bytes (unused shares do not pile up)."""
        if self._per_step is None:
            return
        with self._changed:
            self._available = min(self._per_step, self._available + self._per_step)
            self._changed.notify_all()

    def take(self, size: int, cancel: threading.Event) -> None:
        """Wait for bytes left this step, then take ``size`` (later steps repay any excess)."""
        if self._per_step is None:
            return
        with self._changed:
            while self._available <= 0 and not self._unpaced and not cancel.is_set():
                self._changed.wait(0.05)
            self._available -= size


class AsyncLoader:
    """Runs requests' loads on a few threads and reports each request's end once.

    ``start`` and ``finished`` are called from the engine's thread, ``finished`` once per
    engine step; the loads run on the loader threads, through ``load_blocks`` (the
    worker's read, verify and copy-in).
    """

    def __init__(self, load_blocks: LoadBlocks, size_of: SizeOf, name: str):
        self._load_blocks = load_blocks
        self._size_of = size_of
        self._name = name
        self._pool = ThreadPoolExecutor(
            LOADERS, thread_name_prefix=f"kvmux-{name}-load", initializer=on_this_device()
        )
        self._copies: CopyStream | None = None  # set once the KV cache is registered
        self._budget = StepBudget()
        self._batch_size = LOAD_BATCH
        self._loading: dict[str, threading.Event] = {}  # request -> its cancel flag
        self._ended: list[_Ended] = []
        self._lock = threading.Lock()  # guards _ended
        self._ending = threading.Condition(self._lock)  # a load ended

    def use(self, copies: CopyStream, host_block_bytes: int | None) -> None:
        """The KV cache is registered: where copies run; if it is host memory, the bytes of
        one block of every group (the loads then share the forward pass's cores: at least
        one block a step, and ``HOST_STEP_BYTES`` if more)."""
        self._copies = copies
        if host_block_bytes is not None:
            self._budget = StepBudget(max(HOST_STEP_BYTES, host_block_bytes))
            self._batch_size = 1

    def begin_step(self, idle: bool) -> None:
        """A new engine step; ``idle``: it runs no forward pass (loads go unpaced)."""
        self._budget.unpace(idle)

    def start(self, loads: Sequence[RequestLoad]) -> None:
        """Start each request's load; ``finished`` reports it."""
        for load in loads:
            assert load.req_id not in self._loading, "a request loading twice at once"
            cancel = threading.Event()
            self._loading[load.req_id] = cancel
            self._pool.submit(self._run, load, cancel)

    def _run(self, load: RequestLoad, cancel: threading.Event) -> None:
        """One request's load, batch by batch; it ends reported, whatever happens."""
        ended, first = _Ended(load.req_id), 0
        try:
            if self._copies is None:
                raise RuntimeError("no KV cache registered")
            with self._copies.active():
                for first in range(0, len(load.positions), self._batch_size):
                    batch = load.positions[first : first + self._batch_size]
                    self._budget.take(sum(map(self._size_of, _flat(batch))), cancel)
                    if cancel.is_set():  # the request finished: its blocks are not needed
                        break
                    self._batch(batch, load.start + first, ended)
        except Exception as exc:  # the rest of the load is recomputed
            log.warning("kvmux tier %s: a load failed, recomputing: %r", self._name, exc)
            log.debug("kvmux tier %s: load failure", self._name, exc_info=exc)
            ended.fail(load.start + first, (t.block_id for t in _flat(load.positions[first:])))
        with self._lock:
            self._ended.append(ended)
            self._ending.notify_all()

    def _batch(self, batch: Sequence[Position], start: int, ended: _Ended) -> None:
        landed = iter(self._load_blocks(_flat(batch)))
        for index, position in enumerate(batch, start=start):
            failed = [t.block_id for t in position if not next(landed)]
            if failed:
                ended.fail(index, failed)

    def finished(self, finished_req_ids: Iterable[str] = (), idle: bool = False) -> FinishedLoads:
        """Loads that ended since the last call, each request exactly once.

        ``finished_req_ids`` are requests the engine finished or aborted: their loads
        stop at the next batch, and their failures are not reported (nothing runs on them).
        In an ``idle`` step (no forward pass: every request waits) this waits up to
        ``IDLE_WAIT_SECONDS`` for a load to end, so the engine's loop does not spin and
        hold the interpreter the loader threads need between their reads and copies.
        """
        self._budget.refill()
        for req_id in finished_req_ids:
            cancel = self._loading.get(req_id)
            if cancel is not None:
                cancel.set()
        with self._lock:
            if idle and self._loading and not self._ended:
                self._ending.wait(IDLE_WAIT_SECONDS)
            ended, self._ended = self._ended, []
        report = FinishedLoads()
        for end in ended:
            cancelled = self._loading.pop(end.req_id).is_set()
            report.finished.add(end.req_id)
            if end.failed_at is not None and not cancelled:
                report.failed[end.req_id] = end.failed_at
                report.failed_blocks |= end.failed_blocks
        return report

    def close(self) -> None:
        """Stop every load and release the threads."""
        for cancel in self._loading.values():
            cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
