"""Preallocated host slots of whole blocks: the memory tier's storage (torch).

The slab holds ``slots`` blocks. Layer position ``p`` (a group's ``p``-th layer) of every
slot lives in one host tensor, pinned when the KV cache is on a GPU, so a step's saves
of one group are one gather per layer from the KV cache into a run of slots, and its
loads one scatter per layer. Nothing goes through Python ``bytes``.

Copies move each layer's bytes, viewed with the widest element that divides a block's
row (16 bytes, as a complex128, where it can): a scatter (``index_copy_``) moves one
element at a time, so wide elements make it run at the speed of a plain copy. An
element copy is a move of its bits, never arithmetic, so every bit pattern survives.

On CUDA (written for it, checked by ``scripts/gpu_check.sh --quick``) the slots are one
pinned tensor, slot after slot, so a run of consecutive slots is one contiguous range of
host memory. A save gathers every layer of up to ``STAGE_BYTES`` of blocks into a device
buffer, slot-shaped, on the save stream, after an event that marks the forward pass's
writes, then copies it to the slots with one device-to-host copy per run of slots: few,
large copies. Neither the host nor the forward pass waits: it returns a mark of its
copies, which the worker orders the KV cache's writers after only when a later step is
about to overwrite one of the saved blocks (``kvmux.tier.fences``). A load copies each
run of slots to a device buffer and scatters each layer from it on the current stream.
Events per slot order a slot's latest save before the loads that read it (and nothing
else), and a slot's loads before the save that reuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from kvmux.tier.fences import SaveMark
from kvmux.tier.worker.streams import CudaStreams, Streams
from kvmux.tier.worker.transfer import STAGE_BYTES, BlockMover, chunks, index_on, widest_view

__all__ = [
    "CudaMark",
    "HostLayer",
    "HostSlab",
    "SlotEvents",
    "SlotRun",
    "copy_slots_in",
    "slot_runs",
]

ROW_ALIGN = 16  # bytes: every layer's row in a slot starts at a multiple of this


@dataclass(frozen=True)
class SlotRun:
    """Consecutive slots ``start .. start+count`` for the blocks at ``first ..`` of a batch."""

    start: int
    first: int
    count: int


def slot_runs(slots: Sequence[int]) -> list[SlotRun]:
    """The batch's slots as runs of consecutive slots, in batch order."""
    runs: list[SlotRun] = []
    for index, slot in enumerate(slots):
        last = runs[-1] if runs else None
        if last is not None and slot == last.start + last.count:
            runs[-1] = SlotRun(last.start, last.first, last.count + 1)
        else:
            runs.append(SlotRun(slot, index, 1))
    return runs


_SAME_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _as_array(tensor: torch.Tensor) -> numpy.ndarray:
    """The tensor's memory as a NumPy array of an element of the same size (no copy)."""
    return tensor.view(_SAME_SIZE[tensor.element_size()]).numpy()


class SlotEvents:
    """Each slot's latest save, and its latest load on each stream (device events)."""

    def __init__(self, slots: int):
        self._saved: list[Any] = [None] * slots
        self._loaded: list[dict[Any, Any] | None] = [None] * slots  # stream -> event

    def saves_of(self, slots: Sequence[int]) -> list[Any]:
        """The events a load of ``slots`` waits for: the latest save of each, once each."""
        return _distinct(self._saved[slot] for slot in slots)

    def loads_of(self, slots: Sequence[int]) -> list[Any]:
        """The events a save into ``slots`` waits for: their latest loads on every stream."""
        return _distinct(event for slot in slots for event in (self._loaded[slot] or {}).values())

    def saved(self, slots: Sequence[int], event: Any) -> None:
        """A save into ``slots`` ends at ``event``."""
        for slot in slots:
            self._saved[slot] = event

    def loaded(self, slots: Sequence[int], stream: Any, event: Any) -> None:
        """A load from ``slots`` on ``stream`` ends at ``event``."""
        for slot in slots:
            streams = self._loaded[slot]
            if streams is None:
                streams = self._loaded[slot] = {}
            streams[stream] = event  # torch's streams compare and hash by handle


def _distinct(events: Iterable[Any]) -> list[Any]:
    """The events that are not None, each once, in order."""
    seen: dict[int, Any] = {}
    for event in events:
        if event is not None:
            seen.setdefault(id(event), event)
    return list(seen.values())


@dataclass(frozen=True)
class CudaMark:
    """A save's copies in flight on a CUDA device, up to ``event``."""

    event: Any  # torch.cuda.Event

    def order(self, streams: Sequence[Any]) -> None:
        """Make work submitted to each of ``streams`` from now on wait for the copies."""
        for stream in streams:
            stream.wait_event(self.event)


@dataclass(frozen=True)
class HostLayer:
    """One layer's KV cache blocks and slots as arrays, block first (host memory only)."""

    kv: numpy.ndarray
    slab: numpy.ndarray


def copy_slots_in(layer: HostLayer, block_ids: Sequence[int], slots: Sequence[int]) -> None:
    """Copy ``slots`` into blocks ``block_ids`` of one layer, on the calling thread alone.

    One NumPy copy per block, which releases the GIL: torch's scatter would split into
    OpenMP tasks that wait for the forward pass's busy cores.
    """
    for block_id, slot in zip(block_ids, slots, strict=True):
        numpy.copyto(layer.kv[block_id], layer.slab[slot])


def _round_up(size: int) -> int:
    return -(-size // ROW_ALIGN) * ROW_ALIGN


@dataclass(frozen=True)
class _Layer:
    """One layer of a group: its KV cache (wide view), block dimension and slab view."""

    kv: torch.Tensor
    dim: int
    slab: torch.Tensor  # [slots, *block shape], the same element as ``kv``


class HostSlab:
    """Host memory for ``slots`` blocks of every KV cache group, allocated once."""

    def __init__(self, movers: Sequence[BlockMover], slots: int, streams: Streams | None = None):
        """``streams``: where copies are ordered (CUDA's for a KV cache on a GPU; a host
        cache with ``RecordingStreams`` runs the GPU path, for checks)."""
        positions = max((len(m.layer_specs) for m in movers), default=0)
        widths = [
            _round_up(max(m.layer_specs[p].nbytes for m in movers if p < len(m.layer_specs)))
            for p in range(positions)
        ]
        self.device = movers[0].device if movers else torch.device("cpu")
        if streams is None and self.device.type == "cuda":
            streams = CudaStreams(self.device)
        self._streams = streams
        self._on_gpu = streams is not None  # copies go through streams: the GPU path
        self.slots = slots
        self.slot_bytes = sum(widths)  # host bytes of one slot (every layer position)
        self._offsets = [sum(widths[:p]) for p in range(positions)]  # of each position
        self._arena = self._allocate(slots, widths)  # each position's rows of every slot
        self._groups = [self._group_layers(mover) for mover in movers]
        self._layer_bytes = [[spec.nbytes for spec in mover.layer_specs] for mover in movers]
        self._block_bytes = [sum(layers) for layers in self._layer_bytes]
        self._save_stream: Any = None  # made at the first save from a GPU cache
        self._saved: Any = None  # CUDA event after the last save's copies
        self._events = SlotEvents(slots)  # GPU: each slot's latest save and loads
        self._stage_rows = max(1, STAGE_BYTES // max(1, self.slot_bytes))

    def _allocate(self, slots: int, widths: Sequence[int]) -> list[torch.Tensor]:
        """Each layer position's ``[slots, width]`` rows, zeroed (every page committed now,
        not by the first saves of a busy engine). On a GPU one pinned tensor, slot-major
        (``_slots``), so that a run of slots is one copy."""
        if not self._on_gpu:
            self._slots = torch.empty((0, 0), dtype=torch.uint8)
            return [torch.zeros((slots, width), dtype=torch.uint8) for width in widths]
        assert self._streams is not None
        self._slots = self._streams.host_zeros((slots, sum(widths)))
        return [
            self._slots[:, offset : offset + width]
            for offset, width in zip(self._offsets, widths, strict=True)
        ]

    @property
    def pinned_bytes(self) -> int:
        """Host bytes pinned for the slots (none with a KV cache in host memory)."""
        return self._slots.numel() if self._streams is not None and self._streams.pin else 0

    def _group_layers(self, mover: BlockMover) -> list[_Layer]:
        layers = []
        for arena, spec, (tensor, dim) in zip(
            self._arena, mover.layer_specs, mover.kv_layers, strict=False
        ):
            kv = widest_view(tensor, dim)
            block_shape = [size for index, size in enumerate(kv.shape) if index != dim]
            rows = arena[:, : spec.nbytes].view(kv.dtype)
            layers.append(_Layer(kv, dim, rows.view(self.slots, *block_shape)))
        return layers

    @property
    def groups(self) -> int:
        """How many KV cache groups the slab holds blocks of."""
        return len(self._groups)

    def host_layers(self, group: int) -> list[HostLayer]:
        """The group's layers as arrays, in order, for ``copy_slots_in`` (host memory)."""
        assert not self._on_gpu, "a KV cache on a GPU is copied with torch, on streams"
        return [
            HostLayer(_as_array(layer.kv.movedim(layer.dim, 0)), _as_array(layer.slab))
            for layer in self._groups[group]
        ]

    def slot_parts(self, group: int, slot: int) -> list[memoryview]:
        """Raw bytes of each of the group's layers in ``slot``, without copying."""
        return [
            arena[slot, :nbytes].numpy().data.cast("B")
            for arena, nbytes in zip(self._arena, self._layer_bytes[group], strict=False)
        ]

    def block_bytes(self, group: int) -> int:
        """Bytes of one block of ``group``'s layers."""
        return self._block_bytes[group]

    def save(self, group: int, block_ids: Sequence[int], slots: Sequence[int]) -> SaveMark | None:
        """Copy the group's blocks ``block_ids`` of every layer into ``slots``.

        The mark of the copies still in flight on a device; None when they are done.
        """
        if self._on_gpu:
            return self._gpu_save(self._groups[group], block_ids, slots)
        runs = slot_runs(slots)
        index = torch.tensor(list(block_ids), dtype=torch.long)
        for layer in self._groups[group]:
            for run in runs:
                out = layer.slab[run.start : run.start + run.count]
                picked = index[run.first : run.first + run.count]
                if layer.dim == 0 and out.is_contiguous():
                    torch.index_select(layer.kv, 0, picked, out=out)
                else:
                    out.copy_(layer.kv.index_select(layer.dim, picked).movedim(layer.dim, 0))
        return None

    def load(self, group: int, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        """Copy ``slots`` into the group's blocks ``block_ids`` of every layer."""
        if self._on_gpu:
            self._gpu_load(self._groups[group], block_ids, slots)
            return
        runs = slot_runs(slots)
        index = torch.tensor(list(block_ids), dtype=torch.long)
        for layer in self._groups[group]:
            for run in runs:
                rows = layer.slab[run.start : run.start + run.count].movedim(0, layer.dim)
                layer.kv.index_copy_(layer.dim, index[run.first : run.first + run.count], rows)

    def _gpu_save(
        self, layers: list[_Layer], block_ids: Sequence[int], slots: Sequence[int]
    ) -> SaveMark:
        """On the save stream: per chunk, one gather per layer into a slot-shaped device
        buffer, then one device-to-host copy per run of slots."""
        streams = self._streams
        assert streams is not None
        if self._save_stream is None:
            self._save_stream = streams.new_stream()
        written = streams.new_event()
        written.record(streams.current())  # the forward pass's writes into the KV cache
        stream = self._save_stream
        with streams.using(stream):
            stream.wait_event(written)
            for loaded in self._events.loads_of(slots):  # a reused slot may still be read
                stream.wait_event(loaded)
            index = index_on(block_ids, self.device, streams.pin)
            for rows in chunks(len(block_ids), self._stage_rows):
                staged = torch.empty(
                    (rows.stop - rows.start, self.slot_bytes), dtype=torch.uint8, device=self.device
                )
                for layer, offset in zip(layers, self._offsets, strict=False):
                    picked = layer.kv.index_select(layer.dim, index[rows]).movedim(layer.dim, 0)
                    self._rows_of(staged, layer, offset).copy_(picked)
                for run in slot_runs(slots[rows]):
                    out = self._slots[run.start : run.start + run.count]
                    out.copy_(staged[run.first : run.first + run.count], non_blocking=True)
            done = streams.new_event()
            done.record(stream)
        self._saved = done
        self._events.saved(slots, done)
        return CudaMark(done)

    def _gpu_load(
        self, layers: list[_Layer], block_ids: Sequence[int], slots: Sequence[int]
    ) -> None:
        """On the current stream, after the saves of these slots only: per chunk, one
        host-to-device copy per run of slots, then one scatter per layer."""
        streams = self._streams
        assert streams is not None
        stream = streams.current()
        for saved in self._events.saves_of(slots):
            stream.wait_event(saved)
        index = index_on(block_ids, self.device, streams.pin)
        for rows in chunks(len(block_ids), self._stage_rows):
            staged = torch.empty(
                (rows.stop - rows.start, self.slot_bytes), dtype=torch.uint8, device=self.device
            )
            for run in slot_runs(slots[rows]):
                source = self._slots[run.start : run.start + run.count]
                staged[run.first : run.first + run.count].copy_(source, non_blocking=True)
            for layer, offset in zip(layers, self._offsets, strict=False):
                rows_in = self._rows_of(staged, layer, offset).movedim(0, layer.dim)
                layer.kv.index_copy_(layer.dim, index[rows], rows_in)
        loaded = streams.new_event()
        loaded.record(stream)
        self._events.loaded(slots, stream, loaded)

    @staticmethod
    def _rows_of(staged: torch.Tensor, layer: _Layer, offset: int) -> torch.Tensor:
        """One layer's blocks in a slot-shaped buffer, shaped as its slab view's rows."""
        width = layer.slab[0].numel() * layer.slab.element_size()
        block_shape = layer.slab.shape[1:]
        columns = staged[:, offset : offset + width].view(layer.kv.dtype)
        return columns.view(staged.shape[0], *block_shape)

    def flush(self) -> None:
        """Wait until the saves' copies have landed (the host waits, never the GPU)."""
        if self._saved is not None:
            self._saved.synchronize()
