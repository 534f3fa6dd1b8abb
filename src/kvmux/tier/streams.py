"""Where a GPU path's copies are ordered: CUDA streams and events, or stand-ins (torch).

``CudaStreams`` is what a KV cache on a CUDA device uses. ``RecordingStreams`` runs the
same path on the host: every copy is done when it returns, and each stream records the
events it was made to wait for, so a test (or ``scripts/gpu_check.sh --device cpu``)
shows which waits happen, and when, without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import torch

__all__ = ["CudaStreams", "RecordedEvent", "RecordingStream", "RecordingStreams", "Streams"]


class Streams(Protocol):
    """Streams and events of one device."""

    pin: bool  # whether host buffers are pinned (page-locked) for copies to the device

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

    def wait_event(self, event: RecordedEvent) -> None:
        """Work submitted from now on waits for ``event`` (recorded)."""
        self.waited.append(event)

    def synchronize(self) -> None:
        """Nothing runs behind the host's back."""


class RecordingStreams:
    """Host stand-ins for a GPU's streams: ``current`` is the ``forward`` stream, unless
    inside ``using``."""

    pin = False

    def __init__(self) -> None:
        self.forward = RecordingStream("forward")
        self.streams: list[RecordingStream] = []
        self._current: list[RecordingStream] = [self.forward]
        self._events = 0

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
