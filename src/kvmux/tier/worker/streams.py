"""Where a GPU path's copies are ordered: CUDA streams and events, or stand-ins (torch).

``CudaStreams`` is what a KV cache on a CUDA device uses. ``RecordingStreams`` runs the
same path on the host: every copy is done when it returns, and each stream records the
events it was made to wait for, so a test (or ``scripts/gpu_check.sh --device cpu``)
shows which waits happen, and when, without a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch

__all__ = ["CudaStreams", "RecordedEvent", "RecordingStream", "RecordingStreams", "Streams"]


class Streams(Protocol):
    """Streams and events of one device."""

    pin: bool  # whether host buffers are pinned (page-locked) for copies to the device
    scope: str  # streams of one scope may write the same KV cache (one device)

    def host_zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Zeroed host bytes of ``shape``, pinned where ``pin``, of exactly that size."""

    def new_stream(self) -> Any:
        """A stream of its own."""

    def current(self) -> Any:
        """The calling thread's current stream (the forward pass's on the engine thread)."""

    def new_event(self) -> Any:
        """An event (``record(stream)``, ``synchronize()``, ``query()``)."""

    def using(self, stream: Any) -> AbstractContextManager[None]:
        """Run the work submitted inside on ``stream``."""


class CudaStreams:
    """CUDA streams and events of ``device``."""

    pin = True

    def __init__(self, device: torch.device):
        self._device = device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.scope = f"cuda:{index}"

    def host_zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Zeroed host memory, page-locked in place with ``cudaHostRegister``.

        ``pin_memory=True`` would go through torch's caching host allocator, which rounds
        every allocation up to a power of two (a 40 GiB tier would pin 64 GiB) and keeps it
        pinned after the tier is gone. Registered memory is unregistered with its tensor.
        """
        tensor = torch.zeros(shape, dtype=torch.uint8)  # every page committed now
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        if tensor.numel() == 0 or not hasattr(cudart, "cudaHostRegister"):
            return tensor.pin_memory() if tensor.numel() else tensor
        _check(cudart.cudaHostRegister(tensor.data_ptr(), tensor.numel(), 0), "cudaHostRegister")
        weakref.finalize(tensor, _unregister, cudart, tensor.data_ptr())
        return tensor

    def new_stream(self) -> Any:
        """A CUDA stream on the device."""
        return torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]

    def current(self) -> Any:
        """The calling thread's current CUDA stream on the device."""
        return torch.cuda.current_stream(self._device)

    def new_event(self) -> Any:
        """A CUDA event."""
        return torch.cuda.Event()  # type: ignore[no-untyped-call]

    def using(self, stream: Any) -> AbstractContextManager[None]:
        """``torch.cuda.stream(stream)``."""
        return torch.cuda.stream(stream)


def _check(result: Any, call: str) -> None:
    """Raise RuntimeError unless a CUDA runtime call succeeded."""
    if int(result) != 0:
        raise RuntimeError(f"{call} failed: {result}")


def _unregister(cudart: Any, pointer: int) -> None:
    """Unlock memory that ``host_zeros`` registered (its tensor is being freed)."""
    cudart.cudaHostUnregister(pointer)


class RecordedEvent:
    """An event that is done as soon as it is recorded (host copies are synchronous)."""

    def __init__(self, number: int):
        self.number = number
        self.stream: RecordingStream | None = None
        self.host_waits = 0  # times the host waited for it

    def record(self, stream: RecordingStream) -> None:
        """Mark ``stream``'s work so far."""
        self.stream = stream
        stream.recorded.append(self)

    def synchronize(self) -> None:
        """The host waits (counted)."""
        self.host_waits += 1

    def query(self) -> bool:
        """Always done."""
        return True


class RecordingStream:
    """A stream that records what it waited for, and the events recorded on it."""

    def __init__(self, name: str):
        self.name = name
        self.waited: list[RecordedEvent] = []
        self.recorded: list[RecordedEvent] = []
        self.synchronized = 0  # times the host waited for the stream

    def wait_event(self, event: RecordedEvent) -> None:
        """Work submitted from now on waits for ``event`` (recorded)."""
        self.waited.append(event)

    def synchronize(self) -> None:
        """Nothing runs behind the host's back (counted)."""
        self.synchronized += 1


class RecordingStreams:
    """Host stand-ins for a GPU's streams: ``current`` is the ``forward`` stream, unless
    inside ``using``."""

    pin = False

    def __init__(self) -> None:
        self.scope = f"recording {id(self)}"
        self.forward = RecordingStream("forward")
        self.streams: list[RecordingStream] = []
        self._current: list[RecordingStream] = [self.forward]
        self._events = 0

    def host_zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Zeroed host memory (not pinned)."""
        return torch.zeros(shape, dtype=torch.uint8)

    def new_stream(self) -> RecordingStream:
        """A new recording stream."""
        stream = RecordingStream(f"stream {len(self.streams)}")
        self.streams.append(stream)
        return stream

    def current(self) -> RecordingStream:
        """The innermost stream of ``using``, else ``forward``."""
        return self._current[-1]

    def new_event(self) -> RecordedEvent:
        """A numbered event."""
        self._events += 1
        return RecordedEvent(self._events)

    @contextmanager
    def using(self, stream: RecordingStream) -> Iterator[None]:
        """Make ``stream`` current inside."""
        self._current.append(stream)
        try:
            yield
        finally:
            self._current.pop()
