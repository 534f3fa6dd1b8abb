"""A step's load copied layer by layer beside the forward pass (a KV cache in host memory).

vLLM calls ``wait_for_layer_load(layer)`` just before an attention layer reads its KV
cache. A load copied whole in ``start_load_kv`` holds the forward pass for all of it
(11 ms for a 4K-token hit of the benchmark model, 21 ms for 8K, on one core). Copied on
a helper thread on a spare core instead, layer after layer in the forward pass's order,
each layer waits only for its own copy, which ran while the layers before it computed.

A layer the forward pass never waited for (an attention implementation without vLLM's
layer hooks) may have been read before its copy landed: the step's loaded blocks are
then reported as load errors, which vLLM recomputes, and the caller goes back to whole
copies before the forward pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["LayerCopies", "LayerOutcome"]


@dataclass(frozen=True)
class LayerOutcome:
    """How a step's layer copies ended."""

    failed: BaseException | None = None  # the first copy that raised, if any
    unwaited: tuple[str, ...] = ()  # layers copied that the forward pass never waited for
    seconds: float = 0.0  # the helper thread's time copying


@dataclass
class _Step:
    events: dict[str, threading.Event]
    future: Future[tuple[BaseException | None, float]]
    waited: set[str] = field(default_factory=set)


class LayerCopies:
    """Runs each step's per-layer copies, in order, on a helper thread of its own."""

    def __init__(self, name: str):
        from kvmux.tier.worker.transfer import on_this_device  # worker side: torch is there

        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix=f"kvmux-{name}-layers", initializer=on_this_device()
        )
        self._step: _Step | None = None

    @property
    def active(self) -> bool:
        """Whether a step's copies were started and not finished yet."""
        return self._step is not None

    def start(self, copies: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Start copying: ``copies`` are (layer name, copy) in the forward pass's order."""
        assert self._step is None, "finish the step's copies before starting the next"
        events = {name: threading.Event() for name, _ in copies}
        future = self._pool.submit(self._run, copies, events)
        self._step = _Step(events, future)

    @staticmethod
    def _run(
        copies: Sequence[tuple[str, Callable[[], None]]], events: dict[str, threading.Event]
    ) -> tuple[BaseException | None, float]:
        started = time.perf_counter()
        failed: BaseException | None = None
        for name, copy in copies:
            if failed is None:
                try:
                    copy()
                except Exception as exc:  # reported by finish; later layers are not copied
                    failed = exc
            events[name].set()  # never leave the forward pass waiting
        return failed, time.perf_counter() - started

    def wait(self, layer: str) -> None:
        """Block until ``layer``'s copy is done (at once if it has none this step)."""
        step = self._step
        if step is None:
            return
        event = step.events.get(layer)
        if event is not None:
            event.wait()
            step.waited.add(layer)

    def finish(self) -> LayerOutcome:
        """Wait for the step's copies; how they ended."""
        step, self._step = self._step, None
        if step is None:
            return LayerOutcome()
        failed, seconds = step.future.result()
        unwaited = tuple(name for name in step.events if name not in step.waited)
        return LayerOutcome(failed, unwaited, seconds)

    def close(self) -> None:
        """Finish any step and stop the helper thread."""
        self.finish()
        self._pool.shutdown(wait=True)
