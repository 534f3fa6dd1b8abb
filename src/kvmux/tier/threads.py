"""A worker's helper threads (saves, reads, asynchronous loads) run beside the forward pass.

On a CPU engine, vLLM binds the worker's OpenMP threads, the forward pass, to its own
cores and leaves the rest (``VLLM_CPU_NUM_OF_RESERVED_CPU``) to the scheduler and the
front end. A thread inherits the cores of the thread that starts it, so a helper started
from the engine thread would share the forward pass's cores while the reserved ones
idle. Each helper thread therefore moves, as it starts, to the cores its process's
parent may use that the engine thread does not (none spare: it stays), and lowers its
priority, so that whatever it shares, the forward pass comes first.

On an accelerator the worker is not bound: nothing moves, only the priority drops.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

__all__ = ["HELPER_NICE", "has_spare_core", "in_background", "spare_cores"]

log = logging.getLogger(__name__)
HELPER_NICE = 10  # helper threads' CPU priority (Linux): the forward pass's threads come first


def spare_cores(own: set[int], allowed: set[int]) -> set[int]:
    """The cores of ``allowed`` outside ``own``; ``own`` itself if none are."""
    spare = allowed - own
    return spare or own


def has_spare_core() -> bool:
    """Whether a helper thread started now would run off the calling thread's cores.

    True where vLLM bound the forward pass to some cores and left others (its
    multi-process layout on a CPU); False in-process, off Linux, or if unknown.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        own = os.sched_getaffinity(0)
        return spare_cores(own, os.sched_getaffinity(os.getppid())) != own
    except OSError:
        return False


def in_background() -> None:
    """Move the calling (new) thread off the forward pass's cores and lower its priority.

    Linux only; elsewhere, or if the system refuses, the thread keeps its cores and
    priority.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HELPER_NICE)
    except OSError:  # not allowed: normal priority
        log.debug("kvmux: could not lower a helper thread's priority", exc_info=True)
    try:
        own = os.sched_getaffinity(0)
        target = spare_cores(own, os.sched_getaffinity(os.getppid()))
        if target != own:
            os.sched_setaffinity(0, target)
    except OSError:  # the parent is gone or not ours to read: the thread stays
        log.debug("kvmux: could not move a helper thread off the engine's cores", exc_info=True)
