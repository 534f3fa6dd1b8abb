"""A shorter interpreter switch interval while an asynchronous load runs in the process.

The forward pass gives up the interpreter lock inside each torch operation and takes it
back between them. While a loader thread holds it in Python code (an entry's header, the
bookkeeping of a block), the engine's thread waits until the loader lets go, or until
the switch interval forces a switch: 5 ms by default, as long as a decode step's whole
forward pass on a small model. So while a load runs, the interval is at most
``LOADING_SWITCH_SECONDS``, and it goes back to what it was once no load runs.

Only loads shorten it: the saving path's writers run beside every step of a busy
engine, and switching ten times more often between them and the engine's thread costs
throughput; a load runs for a while, and only then does a decoding request wait on it.
The interval is one per process (``sys.setswitchinterval``), so every tier's loader
shares one count of the loads running.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LOADING_SWITCH_SECONDS", "quick_switching"]

LOADING_SWITCH_SECONDS = 0.0005  # the longest the engine's thread waits for a loader's lock


class _Switching:
    """How many loads run, and the interval to restore when none does."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.restore: float | None = None  # None: the interval was short enough already


_STATE = _Switching()


@contextmanager
def quick_switching() -> Iterator[None]:
    """Within: the process's switch interval is at most ``LOADING_SWITCH_SECONDS``."""
    state = _STATE
    with state.lock:
        if state.running == 0:
            before = sys.getswitchinterval()
            state.restore = before if before > LOADING_SWITCH_SECONDS else None
            if state.restore is not None:
                sys.setswitchinterval(LOADING_SWITCH_SECONDS)
        state.running += 1
    try:
        yield
    finally:
        with state.lock:
            state.running -= 1
            if state.running == 0 and state.restore is not None:
                if abs(sys.getswitchinterval() - LOADING_SWITCH_SECONDS) < 1e-7:
                    sys.setswitchinterval(state.restore)  # nobody else changed it since
                state.restore = None
