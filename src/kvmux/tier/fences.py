"""Fences between a step's saves and a later reuse of the saved blocks (pure Python).

On a GPU a save copies the step's blocks to host memory on its own stream, and nothing
waits for it. A block saved in one step may be freed and handed to another request in
a later step, whose forward pass, or a load into it (on any stream, any connector's),
then writes into it: nothing of that step may start before the copy has read the
block. The scheduler sees every allocation, so it tells the workers when that happens
(``TierStepPlan.fence``: the latest step whose saves hold a block allocated now). Only
then does a worker order anything after them, when it binds the step's plan and before
any of the step's work is submitted: every stream that writes the KV cache (the forward
pass's, and the loader's) waits on the device for those copies, and the host never
waits (vLLM's offloading connector flushes its store jobs when their blocks are
allocated again; here the GPU does the waiting). Copies run while the next steps
compute; most have landed by the time their blocks come back.

The scheduler remembers the blocks of the last ``FENCE_STEPS`` steps' saves; the
workers wait for every save older than that (long landed: the wait returns at once),
so the two never disagree about a save the scheduler forgot.

On the host a save's copies are done when the save returns: there is nothing in
flight, and a fence waits for nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = ["FENCE_STEPS", "InFlightSaves", "SaveMark", "SavedBlocks"]

FENCE_STEPS = 8  # steps whose saved blocks the scheduler remembers


class SaveMark(Protocol):
    """A save's copies in flight on a device (a CUDA event, say)."""

    def order(self, streams: Sequence[object]) -> None:
        """Make work submitted to each of ``streams`` from now on wait for these copies."""


class SavedBlocks:
    """Scheduler side: the blocks each of the last ``FENCE_STEPS`` steps saved."""

    def __init__(self, steps: int = FENCE_STEPS):
        self._steps = steps
        self._saved: deque[tuple[int, frozenset[int]]] = deque()  # (step, its blocks)

    def saved(self, step: int, block_ids: Iterable[int]) -> None:
        """Step ``step``'s plan saves ``block_ids``."""
        blocks = frozenset(block_ids)
        if blocks:
            self._saved.append((step, blocks))

    def fence(self, step: int, allocated: Iterable[int]) -> int:
        """The latest remembered step that saved one of ``allocated``; 0 if none.

        ``step`` is the step being planned: saves older than ``FENCE_STEPS`` steps are
        forgotten (the workers wait for them anyway).
        """
        saved = self._saved
        while saved and saved[0][0] <= step - self._steps:
            saved.popleft()
        if not saved:
            return 0
        reused = frozenset(allocated)
        for saved_step, blocks in reversed(saved):
            if not reused.isdisjoint(blocks):
                return saved_step
        return 0


class InFlightSaves:
    """Worker side: the marks of saves whose copies may still be in flight, by step."""

    def __init__(self, steps: int = FENCE_STEPS):
        self._steps = steps
        self._marks: deque[tuple[int, SaveMark]] = deque()  # (step, mark), oldest first

    def __bool__(self) -> bool:
        return bool(self._marks)

    def saved(self, step: int, mark: SaveMark | None) -> None:
        """Step ``step``'s saves are in flight until ``mark`` (None: already done)."""
        if mark is not None:
            self._marks.append((step, mark))

    def before_step(self, step: int, fence: int, streams: Sequence[object]) -> None:
        """Before step ``step`` submits anything: order ``streams`` (those that write the
        KV cache) after the saves of steps up to ``fence``, and after every save older
        than ``FENCE_STEPS`` steps; forget those. The host does not wait.

        One mark is enough: the saves run in order on one stream.
        """
        due = max(fence, step - self._steps)
        marks, last = self._marks, None
        while marks and marks[0][0] <= due:
            last = marks.popleft()[1]
        if last is not None:
            last.order(streams)
