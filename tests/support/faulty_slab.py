"""A memory tier's worker whose slot copies consult a FaultyStore's control file.

The memory tier keeps blocks in host slots, not in a byte store, so the faults that
apply are the call-level ones (error, enospc, latency: a copy in or out that raises or
is slow) and ``evict`` (a slot lost). ``corrupt`` and ``truncate`` do not apply: the
slots are the engine's own memory, written only by its own copies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvmux.metrics import TierStats
from kvmux.stores.dict_store import DictStore
from kvmux.tier.scheduler.plan import BlockTransfer
from kvmux.tier.worker.slab import HostSlab
from kvmux.tier.worker.slab_worker import SlabWorker
from tests.support.faulty_store import FaultyStore

__all__ = ["FaultySlabWorker"]


class _FaultySlab:
    """A HostSlab whose loads and saves go through the control file's call-level faults."""

    def __init__(self, inner: HostSlab, faults: FaultyStore):
        self._inner = inner
        self._faults = faults

    def load(self, group: int, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        run = lambda: self._inner.load(group, block_ids, slots)  # noqa: E731
        self._faults._call("get", "get_many", len(block_ids), run)

    def save(self, group: int, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        run = lambda: self._inner.save(group, block_ids, slots)  # noqa: E731
        self._faults._call("put", "put_many", len(block_ids), run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultySlabWorker(SlabWorker):
    """SlabWorker under the faults of a control file (see ``tests.support.faulty_store``)."""

    def __init__(
        self, name: str, slots: int, rank: int, stats: TierStats, control: str | os.PathLike[str]
    ):
        super().__init__(name, slots, rank, stats)
        self._faults = FaultyStore(DictStore(1, name=name), control)

    def register(self, *args: Any, **kwargs: Any) -> None:
        """SlabWorker's, with the slab behind the faults."""
        super().register(*args, **kwargs)
        self._slab = _FaultySlab(self._slab, self._faults)  # type: ignore[arg-type,assignment]

    def _held(self, transfer: BlockTransfer) -> int | None:
        """SlabWorker's, unless an ``evict`` fault drops the slot first."""
        spec = self._faults.spec()
        evict = spec.fault == "evict" and spec.hits("get") and transfer.key in self._slot_of
        if evict and self._faults._draw(spec):
            self._faults._note(spec, "get", 1, raised=False)
            self._evict(transfer.key)
        return super()._held(transfer)
