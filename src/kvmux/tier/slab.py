"""Preallocated host slots of whole blocks: the memory tier's storage (torch).

The slab holds ``slots`` blocks. Layer position ``p`` (a group's ``p``-th layer) of every
slot lives in one host tensor, pinned when the KV cache is on a GPU, so a step's saves
of one group are one gather per layer from the KV cache into a run of slots, and its
loads one scatter per layer. Nothing goes through Python ``bytes``.

Copies move each layer's bytes, viewed with the widest element that divides a block's
row (16 bytes, as a complex128, where it can): a scatter (``index_copy_``) moves one
element at a time, so wide elements make it run at the speed of a plain copy. An
element copy is a move of its bits, never arithmetic, so every bit pattern survives.

On CUDA (written for it, not run in CI: see ``scripts/gpu_check.sh``) a save gathers on
the device on the save stream, after an event that marks the forward pass's writes, and
copies into the pinned slots without the host or the forward pass waiting: it returns a
mark of its copies, which the worker waits for only when a later step is about to
overwrite one of the saved blocks (``kvmux.tier.fences``). A load copies the slots' runs to the
device and scatters them on the current stream. Events order a slot's save before its
loads and a slot's loads before the save that reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from kvmux.tier.fences import SaveMark
from kvmux.tier.transfer import BlockMover

__all__ = ["CudaMark", "HostLayer", "HostSlab", "SlotRun", "copy_slots_in", "slot_runs"]

_WIDE = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)
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


def _wide(tensor: torch.Tensor, block_dim: int) -> torch.Tensor:
    """The same memory viewed with the widest element that divides its last dimension."""
    if tensor.dim() <= block_dim + 1 or tensor.stride(-1) != 1:
        return tensor
    raw = tensor.view(torch.uint8)
    for dtype in _WIDE:
        size = dtype.itemsize
        aligned = raw.storage_offset() % size == 0 and raw.shape[-1] % size == 0
        if aligned and all(stride % size == 0 for stride in raw.stride()[:-1]):
            return raw.view(dtype)
    return raw


_SAME_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _as_array(tensor: torch.Tensor) -> numpy.ndarray:
    """The tensor's memory as a NumPy array of an element of the same size (no copy)."""
    return tensor.view(_SAME_SIZE[tensor.element_size()]).numpy()


@dataclass(frozen=True)
class CudaMark:
    """A save's copies in flight on a CUDA device, up to ``event``."""

    event: Any  # torch.cuda.Event

    def wait(self) -> None:
        """Return once the copies have landed (the host waits: off the forward path only)."""
        self.event.synchronize()

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

    def __init__(self, movers: Sequence[BlockMover], slots: int):
        positions = max((len(m.layer_specs) for m in movers), default=0)
        widths = [
            _round_up(max(m.layer_specs[p].nbytes for m in movers if p < len(m.layer_specs)))
            for p in range(positions)
        ]
        self.device = movers[0].device if movers else torch.device("cpu")
        self._on_gpu = self.device.type == "cuda"
        self.slots = slots
        self.slot_bytes = sum(widths)  # host bytes of one slot (every layer position)
        # zeroed: every page is committed now, not by the first saves of a busy engine
        self._arena = [
            torch.zeros((slots, width), dtype=torch.uint8, pin_memory=self._on_gpu)
            for width in widths
        ]
        self._groups = [self._group_layers(mover) for mover in movers]
        self._layer_bytes = [[spec.nbytes for spec in mover.layer_specs] for mover in movers]
        self._block_bytes = [sum(layers) for layers in self._layer_bytes]
        self._save_stream: Any = None  # made at the first save from a GPU cache
        self._saved: Any = None  # CUDA event after the last save's copies
        self._loaded: Any = None  # CUDA event after the last load's copies

    def _group_layers(self, mover: BlockMover) -> list[_Layer]:
        layers = []
        for arena, spec, (tensor, dim) in zip(
            self._arena, mover.layer_specs, mover.kv_layers, strict=False
        ):
            kv = _wide(tensor, dim)
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
        runs = slot_runs(slots)
        if self._on_gpu:
            return self._gpu_save(self._groups[group], block_ids, runs)
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
        runs = slot_runs(slots)
        index = torch.tensor(list(block_ids), dtype=torch.long)
        if self._on_gpu:
            self._gpu_load(self._groups[group], index, runs)
            return
        for layer in self._groups[group]:
            for run in runs:
                rows = layer.slab[run.start : run.start + run.count].movedim(0, layer.dim)
                layer.kv.index_copy_(layer.dim, index[run.first : run.first + run.count], rows)

    def _gpu_save(
        self, layers: list[_Layer], block_ids: Sequence[int], runs: list[SlotRun]
    ) -> SaveMark:
        """One gather per layer on the save stream, then device-to-host copies into slots."""
        if self._save_stream is None:
            self._save_stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        forward = torch.cuda.current_stream(self.device)
        written = torch.cuda.Event()  # type: ignore[no-untyped-call]
        written.record(forward)  # the forward pass's writes into the KV cache
        stream = self._save_stream
        with torch.cuda.stream(stream):
            stream.wait_event(written)
            if self._loaded is not None:  # a reused slot may still be read by a load
                stream.wait_event(self._loaded)
            index = torch.tensor(list(block_ids), dtype=torch.long, pin_memory=True)
            index = index.to(self.device, non_blocking=True)
            for layer in layers:
                picked = layer.kv.index_select(layer.dim, index).movedim(layer.dim, 0)
                for run in runs:
                    out = layer.slab[run.start : run.start + run.count]
                    out.copy_(picked[run.first : run.first + run.count], non_blocking=True)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(stream)
        self._saved = done
        return CudaMark(done)

    def _gpu_load(self, layers: list[_Layer], index: torch.Tensor, runs: list[SlotRun]) -> None:
        """Host-to-device copies of the slots' runs, one scatter per layer and run."""
        stream = torch.cuda.current_stream(self.device)
        if self._saved is not None:
            stream.wait_event(self._saved)
        index = index.pin_memory().to(self.device, non_blocking=True)
        for layer in layers:
            for run in runs:
                rows = layer.slab[run.start : run.start + run.count]
                rows = rows.to(self.device, non_blocking=True).movedim(0, layer.dim)
                layer.kv.index_copy_(layer.dim, index[run.first : run.first + run.count], rows)
        loaded = torch.cuda.Event()  # type: ignore[no-untyped-call]
        loaded.record(stream)
        self._loaded = loaded

    def flush(self) -> None:
        """Wait until the saves' copies have landed (the host waits, never the GPU)."""
        if self._saved is not None:
            self._saved.synchronize()
