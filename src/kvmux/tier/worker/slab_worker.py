"""Worker-side half of the memory tier: blocks kept in preallocated host slots.

The scheduler's ``MirrorIndex`` decides which keys the tier holds and which it evicts;
this worker keeps each held key's slot, tagged with the key. A load copies a slot in
only if its tag is the key asked for: a slot that was reused, or a save that never
happened, is a miss, never another block's KV.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from functools import partial

import torch

from kvmux.errors import ConfigError
from kvmux.keys import BlockKey
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan
from kvmux.tier.worker.base import WorkerBase
from kvmux.tier.worker.layered import LayerCopies
from kvmux.tier.worker.slab import HostLayer, HostSlab, copy_slots_in
from kvmux.tier.worker.threads import has_spare_core
from kvmux.tier.worker.transfer import CopyStream, group_movers

__all__ = ["SlabWorker"]

log = logging.getLogger(__name__)


class SlabWorker(WorkerBase):
    """Moves blocks between preallocated host slots and the engine's KV cache for one rank."""

    def __init__(
        self, name: str, slots: int, rank: int, stats: TierStats, by_layer: bool | None = None
    ):
        super().__init__(name, rank, stats)
        self._slots = slots
        self._slab: HostSlab | None = None
        # synchronous loads copied layer by layer beside the forward pass (``layered.py``);
        # None: decided when the KV cache is registered, where a spare core runs them
        self._by_layer = by_layer
        self._layer_copies: LayerCopies | None = None
        self._layer_order: list[tuple[str, int, int]] = []  # (name, group, position)
        self._host_layers: list[list[HostLayer]] = []  # per group, per layer
        self._copying: list[BlockTransfer] = []  # what the step's layer copies load
        # guarded by _lock (asynchronous loads run on loader threads):
        self._slot_of: OrderedDict[BlockKey, int] = OrderedDict()  # least recently used first
        self._tags: list[BlockKey | None] = []  # the key each slot holds
        self._free: deque[int] = deque()  # freed slots, in the order they were freed

    @property
    def registered(self) -> bool:
        """Whether the KV cache is registered and the slots allocated."""
        return self._slab is not None

    def register(
        self,
        kv_caches: dict[str, torch.Tensor],
        num_blocks: int | None,
        groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """Adopt the engine's KV cache tensors and allocate the slots (see ``WorkerBase``)."""
        movers = group_movers(kv_caches, num_blocks, groups)
        self._layer_order = _layer_order(list(kv_caches), groups)
        try:
            slab = HostSlab(movers, self._slots)
        except RuntimeError as exc:  # e.g. more pinned memory than the host can lock
            raise ConfigError(
                "capacity",
                f"memory tier {self.name!r} cannot allocate {self._slots} block slots: {exc}",
                "a budget the host can allocate (pinned, with a GPU KV cache)",
            ) from exc
        with self._lock:
            self._slab = slab
            self._slot_of.clear()
            self._tags = [None] * slab.slots
            self._free = deque(range(slab.slots))
        host = slab.slot_bytes if slab.device.type == "cpu" else None
        self._use_copies(CopyStream(slab.device), host)
        self._choose_copies(slab)
        log.info(
            "kvmux tier %s: %d host slots of %d bytes (%.1f MiB)%s",
            self.name,
            slab.slots,
            slab.slot_bytes,
            slab.slots * slab.slot_bytes / 2**20,
            ", pinned" if slab.device.type == "cuda" else "",
        )

    def _bytes_of(self, transfer: BlockTransfer) -> int:
        return self._slab.block_bytes(transfer.group) if self._slab is not None else 0

    # -- loads ---------------------------------------------------------------

    def _load_blocks(self, transfers: Sequence[BlockTransfer]) -> list[bool]:
        """Copy each block in from its slot if the slot still holds its key."""
        started = time.perf_counter()
        landed = [False] * len(transfers)
        loaded_bytes = 0
        with self._lock:
            slab = self._slab
            assert slab is not None, "a load before the KV cache was registered"
            for group, rows in self._by_group(transfers).items():
                found = [
                    (row, slot) for row in rows if (slot := self._held(transfers[row])) is not None
                ]
                if not found:
                    continue
                try:
                    slab.load(
                        group, [transfers[row].block_id for row, _ in found], [s for _, s in found]
                    )
                except Exception as exc:  # never wrong KV: the blocks are recomputed
                    for row, _ in found:  # and their slots freed: the index forgets them too
                        self._evict(transfers[row].key)
                    self._stats.add(store_errors=1)
                    self._warn_once("copy", "kvmux tier %s: copy-in failed: %r", self.name, exc)
                    continue
                for row, _ in found:
                    landed[row] = True
                loaded_bytes += len(found) * slab.block_bytes(group)
        self._report_missing(t.key for t, ok in zip(transfers, landed, strict=True) if not ok)
        self._stats.add(
            loaded_blocks=sum(landed),
            load_errors=len(landed) - sum(landed),
            bytes_loaded=loaded_bytes,
            load_seconds=time.perf_counter() - started,
        )
        return landed

    def load(self, loads: Sequence[BlockTransfer]) -> None:
        """Copy the planned blocks in: layer by layer beside the forward pass where a
        spare core can (``wait_layer`` before each layer), else all before it."""
        self.finish_layers()  # a step whose end was not seen
        if not self.copies_by_layer:
            super().load(loads)
            return
        self._failed_this_step = set()  # a new step: what failed before is settled
        if loads and self._slab is not None:
            self._start_layer_copies(loads)

    @property
    def copies_by_layer(self) -> bool:
        """Whether loads are copied layer by layer (decided when the KV cache is adopted)."""
        # not under a rank agreement: whether a rank copies by layer is its own to decide
        return bool(self._by_layer) and self._layer_copies is not None and self._agreement is None

    def _choose_copies(self, slab: HostSlab) -> None:
        """Copy loads layer by layer where a spare core runs them (the calling thread is
        the forward pass's: vLLM registers the KV cache from it), or as told."""
        if self._by_layer is None:
            self._by_layer = slab.device.type == "cpu" and has_spare_core()
        if self._by_layer and slab.device.type == "cpu":
            self._host_layers = [slab.host_layers(g) for g in range(slab.groups)]
            self._layer_copies = LayerCopies(self.name)
        how = "layer by layer on a spare core" if self._by_layer else "before the forward pass"
        log.info("kvmux tier %s: loads are copied %s", self.name, how)

    def _start_layer_copies(self, loads: Sequence[BlockTransfer]) -> None:
        """Find each block's slot now; copy them in on the helper thread, layer by layer."""
        assert self._layer_copies is not None
        batches: dict[int, tuple[list[int], list[int]]] = {}  # group -> block ids, slots
        held = [False] * len(loads)
        with self._lock:
            for group, rows in self._by_group(loads).items():
                for row in rows:
                    slot = self._held(loads[row])
                    if slot is not None:
                        held[row] = True
                        blocks, slots = batches.setdefault(group, ([], []))
                        blocks.append(loads[row].block_id)
                        slots.append(slot)
        missed = [t for t, ok in zip(loads, held, strict=True) if not ok]
        if missed:
            self._fail_loads(missed)
        self._copying = [t for t, ok in zip(loads, held, strict=True) if ok]
        if not self._copying:
            return
        copies: list[tuple[str, Callable[[], None]]] = [
            (name, partial(copy_slots_in, self._host_layers[group][position], *batches[group]))
            for name, group, position in self._layer_order
            if group in batches
        ]
        self._layer_copies.start(copies)

    def wait_layer(self, layer_name: str) -> None:
        """Return once ``layer_name``'s blocks of this step's load are in."""
        if self._layer_copies is not None:
            self._layer_copies.wait(layer_name)

    def finish_layers(self) -> None:
        """Wait for this step's layer copies; count them, or turn them into load errors."""
        if self._layer_copies is None or not self._layer_copies.active:
            return
        outcome = self._layer_copies.finish()
        copied, self._copying = self._copying, []
        if outcome.failed is None and not outcome.unwaited:
            assert self._slab is not None
            self._stats.add(
                loaded_blocks=len(copied),
                bytes_loaded=sum(self._slab.block_bytes(t.group) for t in copied),
                load_seconds=outcome.seconds,
            )
            return
        if outcome.unwaited:  # the forward pass may have read them first: recomputed
            self._by_layer = False
            self._warn_once(
                "unwaited",
                "kvmux tier %s: layers %s were never waited for; their blocks are recomputed "
                "and loads are copied before the forward pass from now on",
                self.name,
                ", ".join(outcome.unwaited[:4]),
            )
        if outcome.failed is not None:  # slots freed, the index forgets them
            with self._lock:
                for transfer in copied:
                    self._evict(transfer.key)
            self._stats.add(store_errors=1)
            self._warn_once("copy", "kvmux tier %s: copy-in failed: %r", self.name, outcome.failed)
        self._fail_loads(copied, forget=outcome.failed is not None)

    def _fail_loads(self, transfers: Sequence[BlockTransfer], forget: bool = True) -> None:
        """Blocks this step's load promised and did not deliver: load errors (recomputed)."""
        failed = {t.block_id for t in transfers}
        self._load_errors |= failed
        self._failed_this_step |= failed
        if forget:
            self._report_missing(t.key for t in transfers)
        self._stats.add(load_errors=len(transfers))

    def take_load_errors(self) -> set[int]:
        """Block ids that failed to load since the last call (this step's copies ended)."""
        self.finish_layers()
        return super().take_load_errors()

    def _held(self, transfer: BlockTransfer) -> int | None:
        """The slot holding the transfer's key (now most recently used); None: not held."""
        slot = self._slot_of.get(transfer.key)
        if slot is None:
            return None
        if self._tags[slot] != transfer.key:  # never happens unless the bookkeeping is wrong
            self._warn_once("tag", "kvmux tier %s: slot %d holds another key", self.name, slot)
            del self._slot_of[transfer.key]
            return None
        self._slot_of.move_to_end(transfer.key)
        return slot

    @staticmethod
    def _by_group(transfers: Sequence[BlockTransfer]) -> dict[int, list[int]]:
        rows_of: dict[int, list[int]] = {}
        for row, transfer in enumerate(transfers):
            rows_of.setdefault(transfer.group, []).append(row)
        return rows_of

    # -- saves ---------------------------------------------------------------

    def save(self, plan: TierStepPlan) -> None:
        """Evict the planned keys, then copy the planned blocks into free slots."""
        self.finish_layers()  # a slot a layer copy reads may be reused below
        saves = self._untainted(plan)
        slab = self._slab
        if slab is None or not (saves or plan.evictions):
            return
        started = time.perf_counter()
        saved = saved_bytes = 0
        with self._lock:
            for key in plan.evictions:
                self._evict(key)
            for group, rows in self._by_group(saves).items():
                count = self._save_group(slab, group, [saves[row] for row in rows], plan.step)
                saved += count
                saved_bytes += count * slab.block_bytes(group)
            stored = len(self._slot_of) * slab.slot_bytes
        self._stats.add(
            saved_blocks=saved,
            bytes_saved=saved_bytes,
            save_seconds=time.perf_counter() - started,
        )
        self._stats.observe_stored(stored)

    def _save_group(
        self, slab: HostSlab, group: int, transfers: list[BlockTransfer], step: int
    ) -> int:
        """Copy a group's blocks not held yet into free slots; how many were saved."""
        new: dict[BlockKey, int] = {}  # key -> block id, each key once
        for transfer in transfers:
            if transfer.key in self._slot_of:
                self._slot_of.move_to_end(transfer.key)
            else:
                new.setdefault(transfer.key, transfer.block_id)
        slots = self._take_slots(len(new))
        keys = list(new)[: len(slots)]
        if not keys:
            return 0
        try:
            mark = slab.save(group, [new[key] for key in keys], slots)
        except Exception as exc:  # the blocks are simply not saved
            self._free.extend(slots)
            self._missing.update(keys)  # under _lock: the scheduler's index forgets them
            self._stats.add(save_errors=len(keys), store_errors=1)
            self._warn_once("save", "kvmux tier %s: copy-out failed: %r", self.name, exc)
            return 0
        self._in_flight.saved(step, mark)
        for key, slot in zip(keys, slots, strict=True):
            self._slot_of[key] = slot
            self._tags[slot] = key
        return len(keys)

    def _take_slots(self, count: int) -> list[int]:
        """``count`` free slots (fewer only if the slab is smaller), oldest freed first.

        The scheduler evicts before it admits, so slots are free; if they are not (its
        index and this worker disagree), the least recently used keys here make room and
        are reported missing.
        """
        while len(self._free) < count and self._slot_of:
            key, _ = next(iter(self._slot_of.items()))
            self._evict(key)
            self._missing.add(key)  # under _lock
        return [self._free.popleft() for _ in range(min(count, len(self._free)))]

    def _evict(self, key: BlockKey) -> None:
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            self._tags[slot] = None
            self._free.append(slot)

    def flush(self) -> None:
        """Wait until the saves' copies have landed (on CUDA; on the host they have)."""
        if self._slab is not None:
            self._slab.flush()

    def clear(self) -> None:
        """Forget every block (the slots stay allocated)."""
        self.finish_layers()
        with self._lock:
            for key in list(self._slot_of):
                self._evict(key)

    def close(self) -> None:
        """Stop loads and release the slots."""
        if self._layer_copies is not None:
            self.finish_layers()
            self._layer_copies.close()
        super().close()
        with self._lock:
            self._slab = None
            self._slot_of.clear()
            self._free.clear()


def _layer_order(
    names: list[str], groups: Sequence[Sequence[str]] | None
) -> list[tuple[str, int, int]]:
    """Each layer as (name, group, position in its group), in the order of ``names``."""
    if groups is None:
        return [(name, 0, position) for position, name in enumerate(names)]
    group_of = {name: g for g, members in enumerate(groups) for name in members}
    seen = [0] * len(groups)
    order = []
    for name in names:
        if name in group_of:
            group = group_of[name]
            order.append((name, group, seen[group]))
            seen[group] += 1
    return order
