"""Worker-side copies between the engine's paged KV cache and host bytes (torch).

Each layer's cache is a tensor with one dimension indexing blocks (dimension 0 on the
CPU backend, 1 on backends that keep K and V apart in front). One block of one layer
is treated as an opaque unit and copied whole, on the device of the KV tensors.

The same calls serve a KV cache in host memory and one on a GPU. On the host, a copy is
done when the call returns. On CUDA (written for it, not run in CI: see
``scripts/gpu_check.sh``), as in vLLM's kv_offload worker: saves go through a tier's
staging slots (``slab.HostSlab``, pinned), gathered per layer on a stream of their own
after an event that marks the forward pass's writes, and neither the host nor the
forward pass waits for them, unless a later step reuses one of their blocks
(``tier/fences.py``). Loads stage
each layer's blocks in pinned memory and copy them in with one transfer and one
``index_copy_`` per layer on the current stream (the loader's own stream for
asynchronous loads), so nothing but the GPU orders them before the forward pass.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy
import torch

from kvmux.codec import DecodedEntry, LayerSpec
from kvmux.errors import CorruptEntry, UnsupportedLayout
from kvmux.tier.worker.staging import StagingBuffers
from kvmux.tier.worker.streams import CudaStreams, Streams
from kvmux.tier.worker.threads import in_background

__all__ = [
    "STAGE_BYTES",
    "BlockMover",
    "CopyStream",
    "chunks",
    "group_movers",
    "head_axis",
    "head_movers",
    "head_views",
    "index_on",
    "on_this_device",
    "widest_view",
]

STAGE_BYTES = 64 * 2**20  # bytes of entries a GPU load stages at a time, at most

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
# an entry's bytes are read-only and only ever read here: PyTorch's warning that a tensor
# over them could be written is noise in the engine's log (for this module's calls only)
warnings.filterwarnings(
    "ignore", message="The given buffer is not writable", category=UserWarning, module=__name__
)


_WIDE = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)


def widest_view(tensor: torch.Tensor, block_dim: int) -> torch.Tensor:
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


def chunks(count: int, rows: int) -> list[slice]:
    """``range(count)`` in slices of at most ``rows``: the stages of a GPU copy."""
    return [slice(first, min(count, first + rows)) for first in range(0, count, rows)]


def index_on(block_ids: Sequence[int], device: torch.device, pin: bool) -> torch.Tensor:
    """Block ids as an index on ``device``, copied from pinned memory without a host wait."""
    index = torch.tensor(list(block_ids), dtype=torch.long, pin_memory=pin)
    return index.to(device, non_blocking=True)


_KNOWN_LAYOUTS = (
    "blocks first ([blocks, ...]: FlashInfer, MLA, the CPU backend) or second "
    "([2, blocks, ...]: FlashAttention)"
)


def _block_dim(tensor: torch.Tensor, num_blocks: int | None) -> int:
    """The dimension that indexes blocks: 0 or 1, wherever it has ``num_blocks`` entries.

    Without ``num_blocks`` (an engine that does not say), blocks come first. A tensor with
    neither dimension of ``num_blocks`` raises UnsupportedLayout, naming its shape.
    """
    if num_blocks is None:
        return 0
    for dim in (0, 1):
        if tensor.dim() > dim and tensor.shape[dim] == num_blocks:
            return dim
    raise UnsupportedLayout(
        f"KV cache tensor of shape {tuple(tensor.shape)} has no dimension of {num_blocks} "
        f"blocks at 0 or 1; kvmux copies only {_KNOWN_LAYOUTS}"
    )


class BlockMover:
    """Copies whole blocks of every layer out to host tensors and back in."""

    def __init__(
        self,
        kv_caches: Mapping[str, torch.Tensor],
        num_blocks: int | None = None,
        streams: Streams | None = None,
    ):
        """``streams``: where copies are ordered (CUDA's for a KV cache on a GPU; a host
        cache with ``RecordingStreams`` runs the GPU path, for checks)."""
        self._layers = list(kv_caches.values())
        self._dims = [_block_dim(t, num_blocks) for t in self._layers]
        specs = []
        for tensor, dim in zip(self._layers, self._dims, strict=True):
            if tensor.dtype not in _NAMES:
                raise TypeError(f"unsupported KV cache dtype {tensor.dtype}")
            shape = tuple(s for i, s in enumerate(tensor.shape) if i != dim)
            specs.append(LayerSpec(shape=shape, dtype=_NAMES[tensor.dtype]))
        self.layer_specs = tuple(specs)
        self.device = self._layers[0].device if self._layers else torch.device("cpu")
        if streams is None and self.device.type == "cuda":
            streams = CudaStreams(self.device)
        self.streams = streams
        self._on_gpu = streams is not None  # loads stage in host buffers: the GPU path
        self._staging = StagingBuffers(pin=streams is not None and streams.pin)
        self._row_bytes = sum(spec.nbytes for spec in self.layer_specs)
        self._stage_rows = max(1, STAGE_BYTES // max(1, self._row_bytes))
        self._arrays: list[numpy.ndarray | None] | None = None  # see _host_arrays

    @property
    def kv_layers(self) -> list[tuple[torch.Tensor, int]]:
        """Each layer's KV cache tensor with the dimension that indexes its blocks."""
        return list(zip(self._layers, self._dims, strict=True))

    def copy_out(self, block_ids: Sequence[int]) -> list[torch.Tensor]:
        """Host copies, one per layer, shaped ``[len(block_ids), *block_shape]`` (synchronous).

        Saves go through a tier's staging slots (``HostSlab``); this reads blocks back
        whole, for checks.
        """
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        return [
            tensor.index_select(dim, index).movedim(dim, 0).contiguous().cpu()
            for tensor, dim in zip(self._layers, self._dims, strict=True)
        ]

    @staticmethod
    def block_parts(copies: Sequence[torch.Tensor], row: int) -> list[memoryview]:
        """Raw bytes of block ``row`` of each layer copy, without copying."""
        return [c[row].view(torch.uint8).numpy().data.cast("B") for c in copies]

    def check(self, entry: DecodedEntry) -> None:
        """Raise CorruptEntry unless ``entry`` has this cache's layer shapes and dtypes."""
        if entry.layers != self.layer_specs:
            raise CorruptEntry("entry layer shapes or dtypes differ from this engine's cache")

    def copy_in_many(self, block_ids: Sequence[int], entries: Sequence[DecodedEntry]) -> None:
        """Write checked entries (see ``check``) into their blocks of every layer."""
        if not self._on_gpu:
            for block_id, entry in zip(block_ids, entries, strict=True):
                self.copy_in(block_id, entry)
            return
        self._staged_copy_in(block_ids, entries)

    def _staged_copy_in(self, block_ids: Sequence[int], entries: Sequence[DecodedEntry]) -> None:
        """Per ``STAGE_BYTES`` of entries: their payloads into a reused host buffer (one
        copy each: a payload holds its layers back to back, as a row here), one copy to
        the device, one scatter per layer; on the current stream, the host never waits."""
        streams = self.streams
        assert streams is not None
        index = index_on(block_ids, self.device, streams.pin)
        offsets = entries[0].layer_offsets() if entries else []
        for rows_of in chunks(len(entries), self._stage_rows):
            chunk = entries[rows_of]
            buffer = self._staging.take(len(chunk) * self._row_bytes)
            host = buffer[: len(chunk) * self._row_bytes].view(len(chunk), self._row_bytes)
            rows = host.numpy()
            for row, entry in enumerate(chunk):
                rows[row] = numpy.frombuffer(entry.payload, numpy.uint8, self._row_bytes)
            device_rows = host.to(self.device, non_blocking=True)  # the host buffer on the host
            picked = index[rows_of]
            for tensor, dim, offset in zip(self._layers, self._dims, offsets, strict=True):
                target, source = self._scatter_views(tensor, dim, device_rows, offset)
                target.index_copy_(dim, picked, source.movedim(0, dim))
            read = streams.new_event()  # after every read of the buffer, wherever it is
            read.record(streams.current())
            self._staging.give_back(buffer, read)

    def _scatter_views(
        self, tensor: torch.Tensor, dim: int, rows: torch.Tensor, offset: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's cache and its blocks in ``rows`` (bytes from ``offset``), both viewed
        with one element: the widest that aligns (fast scatters; and fp8's own scatter is
        not supported everywhere)."""
        target = widest_view(tensor, dim)
        size = target.element_size()
        if size > 1 and (offset % size or self._row_bytes % size):
            target = target.view(torch.uint8)  # bytes always align
        block_shape = [s for i, s in enumerate(target.shape) if i != dim]
        nbytes = target.select(dim, 0).numel() * target.element_size()
        source = rows[:, offset : offset + nbytes].view(target.dtype)
        return target, source.view(rows.shape[0], *block_shape)

    def _host_arrays(self) -> list[numpy.ndarray | None]:
        """Each layer's cache as a byte array with blocks first, where it is in host memory
        with a contiguous last dimension (made once: a view per copy costs more than a
        small head's copy)."""
        if self._arrays is None:
            self._arrays = [
                tensor.movedim(dim, 0).view(torch.uint8).numpy()
                if tensor.device.type == "cpu" and tensor.stride(-1) == 1
                else None
                for tensor, dim in zip(self._layers, self._dims, strict=True)
            ]
        return self._arrays

    def copy_in(self, block_id: int, entry: DecodedEntry) -> None:
        """Write a verified entry into block ``block_id`` of every layer."""
        self.check(entry)
        offsets = entry.layer_offsets()
        arrays = self._host_arrays()
        for tensor, dim, spec, offset, array in zip(
            self._layers, self._dims, self.layer_specs, offsets, arrays, strict=True
        ):
            if array is not None:
                _host_copy(array[block_id], entry.payload, offset)
                continue
            target = tensor.select(dim, block_id)
            raw = torch.frombuffer(
                entry.payload, dtype=torch.uint8, count=spec.nbytes, offset=offset
            )
            target.copy_(raw.view(_DTYPES[spec.dtype]).view(spec.shape))


def group_movers(
    kv_caches: dict[str, torch.Tensor],
    num_blocks: int | None,
    groups: Sequence[Sequence[str]] | None = None,
) -> list[BlockMover]:
    """One mover per KV cache group (its layers in the order of ``kv_caches``); one for
    every layer without ``groups``."""
    layer_groups = [kv_caches] if groups is None else [_layers_of(kv_caches, g) for g in groups]
    return [BlockMover(layers, num_blocks) for layers in layer_groups]


def head_movers(
    kv_caches: dict[str, torch.Tensor],
    num_blocks: int | None,
    groups: Sequence[Sequence[str]] | None,
    heads: int,
) -> list[list[BlockMover]]:
    """Per KV cache group (as ``group_movers``): one mover per head position of this
    rank's cache, each over that head of every layer of the group."""
    layer_groups = [kv_caches] if groups is None else [_layers_of(kv_caches, g) for g in groups]
    return [
        [BlockMover(view, num_blocks) for view in head_views(layers, num_blocks, heads)]
        for layers in layer_groups
    ]


def _layers_of(kv_caches: dict[str, torch.Tensor], names: Sequence[str]) -> dict[str, torch.Tensor]:
    wanted = set(names)
    return {name: tensor for name, tensor in kv_caches.items() if name in wanted}


_HEAD_LAYOUTS = (
    "[blocks, heads, tokens, bytes] (vLLM's KV cache views: the CPU backend, FlashInfer, "
    "FlashAttention) or [2, blocks, tokens, heads, head size]"
)


def head_axis(tensor: torch.Tensor, block_dim: int) -> int:
    """The dimension of ``tensor`` that indexes its KV heads; UnsupportedLayout if unknown."""
    if block_dim == 0 and tensor.dim() == 4:
        return 1
    if block_dim == 1 and tensor.dim() == 5:
        return 3
    raise UnsupportedLayout(
        f"KV cache tensor of shape {tuple(tensor.shape)} (blocks at {block_dim}) has no KV "
        f"head dimension kvmux knows; kvmux splits {_HEAD_LAYOUTS} by head"
    )


def head_views(
    kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None, heads: int
) -> list[dict[str, torch.Tensor]]:
    """Per head position: every layer's cache narrowed to that head (views, no copy).

    A view keeps its head dimension, of size 1, so one head's block has the same shape
    whatever the number of heads a rank holds: that is what makes it shareable.
    """
    views: list[dict[str, torch.Tensor]] = [{} for _ in range(heads)]
    for name, tensor in kv_caches.items():
        axis = head_axis(tensor, _block_dim(tensor, num_blocks))
        if tensor.shape[axis] != heads:
            raise UnsupportedLayout(
                f"KV cache tensor {name} of shape {tuple(tensor.shape)} holds "
                f"{tensor.shape[axis]} KV heads at dimension {axis}, not this rank's {heads}"
            )
        for position in range(heads):
            views[position][name] = tensor.narrow(axis, position, 1)
    return views


def _host_copy(destination: numpy.ndarray, payload: memoryview, offset: int) -> None:
    """Copy a layer's bytes into ``destination`` (host memory) on this thread alone.

    A plain memory copy that releases the GIL: torch's ``copy_`` splits a block into
    OpenMP tasks, and on a machine whose cores run the forward pass those tasks wait for
    busy cores (a 256 KiB block took 2 to 7 ms instead of about 40 us).
    """
    source = numpy.frombuffer(payload, numpy.uint8, destination.size, offset)
    numpy.copyto(destination, source.reshape(destination.shape))


_LOADER_STREAMS: dict[str, list[Any]] = {}  # scope (a device) -> every tier's loader stream
_LOADERS_LOCK = threading.Lock()


class CopyStream:
    """Where a loader thread's copies into the KV cache run, off the forward pass.

    On the CPU a copy is done when ``copy_`` returns (torch releases the GIL meanwhile).
    On CUDA the copies go to a stream of their own, not the forward pass's, and leaving
    ``active`` waits for them (even when a copy raised): a load is reported finished only
    once its blocks are in. Every tier's loader stream on a device is known to the others,
    so that a fence orders all of them (``writers``).
    """

    def __init__(self, device: torch.device, streams: Streams | None = None):
        if streams is None and device.type == "cuda":
            streams = CudaStreams(device)
        self._streams = streams
        self._stream = streams.new_stream() if streams is not None else None
        if streams is not None:
            with _LOADERS_LOCK:
                _LOADER_STREAMS.setdefault(streams.scope, []).append(self._stream)

    def writers(self) -> list[Any]:
        """The streams that write the KV cache: the forward pass's (the caller's current
        stream) and every tier's loader stream on the device; none on the host, where a
        copy is done when it returns."""
        if self._streams is None:
            return []
        with _LOADERS_LOCK:
            loaders = list(_LOADER_STREAMS.get(self._streams.scope, ()))
        return [self._streams.current(), *loaders]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the copies made inside on this stream; wait for them on the way out."""
        if self._streams is None or self._stream is None:
            yield
            return
        try:
            with self._streams.using(self._stream):
                yield
        finally:  # copies submitted before a failure still land before the load is reported
            self._stream.synchronize()

    def close(self) -> None:
        """Forget this stream (its tier is closed)."""
        if self._streams is None:
            return
        with _LOADERS_LOCK:
            loaders = _LOADER_STREAMS.get(self._streams.scope, [])
            if any(stream is self._stream for stream in loaders):
                loaders[:] = [stream for stream in loaders if stream is not self._stream]


def _current_cuda_device() -> int | None:
    """The calling thread's CUDA device, where torch has CUDA initialized; else None."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):  # type: ignore[no-untyped-call]
        return None
    return int(torch.cuda.current_device())


def on_this_device() -> Callable[[], None]:
    """A thread initializer: ``in_background``, then the CUDA device of the caller now.

    A new thread starts on CUDA device 0 whatever its creator's; under tensor
    parallelism each rank's helpers must copy on their rank's own device.
    """
    device = _current_cuda_device()

    def start() -> None:
        in_background()
        if device is not None:
            torch.cuda.set_device(device)

    return start
