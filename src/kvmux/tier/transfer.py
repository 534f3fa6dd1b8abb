"""Worker-side copies between the engine's paged KV cache and host bytes (torch).

Each layer's cache is a tensor with one dimension indexing blocks (dimension 0 on the
CPU backend, 1 on backends that keep K and V apart in front). One block of one layer
is treated as an opaque unit and copied whole, on the device of the KV tensors; host
copies of device memory go through pinned buffers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy
import torch

from kvmux.codec import DecodedEntry, LayerSpec
from kvmux.errors import CorruptEntry

__all__ = ["BlockMover", "CopyStream"]

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


def _block_dim(tensor: torch.Tensor, num_blocks: int | None) -> int:
    if num_blocks is not None:
        for dim in (0, 1):
            if tensor.dim() > dim and tensor.shape[dim] == num_blocks:
                return dim
    return 0


class BlockMover:
    """Copies whole blocks of every layer out to host tensors and back in."""

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None):
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

    def copy_out(self, block_ids: Sequence[int]) -> list[torch.Tensor]:
        """Host copies, one per layer, shaped ``[len(block_ids), *block_shape]``."""
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        copies = []
        for tensor, dim in zip(self._layers, self._dims, strict=True):
            picked = tensor.index_select(dim, index).movedim(dim, 0)
            if picked.device.type == "cpu":
                copies.append(picked.contiguous())
            else:
                host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
                host.copy_(picked)
                copies.append(host)
        return copies

    @staticmethod
    def block_parts(copies: Sequence[torch.Tensor], row: int) -> list[memoryview]:
        """Raw bytes of block ``row`` of each layer copy, without copying."""
        return [c[row].view(torch.uint8).numpy().data.cast("B") for c in copies]

    def copy_in(self, block_id: int, entry: DecodedEntry) -> None:
        """Write a verified entry into block ``block_id`` of every layer."""
        if entry.layers != self.layer_specs:
            raise CorruptEntry("entry layer shapes or dtypes differ from this engine's cache")
        offsets = entry.layer_offsets()
        for tensor, dim, spec, offset in zip(
            self._layers, self._dims, self.layer_specs, offsets, strict=True
        ):
            target = tensor.select(dim, block_id)
            if target.device.type == "cpu" and target.stride(-1) == 1:
                _host_copy(target, entry.payload, offset)
                continue
            raw = torch.frombuffer(
                entry.payload, dtype=torch.uint8, count=spec.nbytes, offset=offset
            )
            target.copy_(raw.view(_DTYPES[spec.dtype]).view(spec.shape))


def _host_copy(target: torch.Tensor, payload: memoryview, offset: int) -> None:
    """Copy a layer's bytes into ``target`` (host memory) on this thread alone.

    A plain memory copy that releases the GIL: torch's ``copy_`` splits a block into
    OpenMP tasks, and on a machine whose cores run the forward pass those tasks wait for
    busy cores (a 256 KiB block took 2 to 7 ms instead of about 40 us).
    """
    destination = target.view(torch.uint8).numpy()
    source = numpy.frombuffer(payload, numpy.uint8, destination.size, offset)
    numpy.copyto(destination, source.reshape(destination.shape))


class CopyStream:
    """Where a loader thread's copies into the KV cache run, off the forward pass.

    On the CPU a copy is done when ``copy_`` returns (torch releases the GIL meanwhile).
    On CUDA the copies go to a stream of their own, not the forward pass's, and leaving
    ``active`` waits for them: a load is reported finished only once its blocks are in.
    """

    def __init__(self, device: torch.device):
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the copies made inside on this stream; wait for them on the way out."""
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            yield
        self._stream.synchronize()
