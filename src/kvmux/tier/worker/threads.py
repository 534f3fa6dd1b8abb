"""A worker's helper threads (saves, reads, asynchronous loads) run beside the forward pass.

On a CPU engine, vLLM binds the worker's OpenMP threads, the forward pass, to its own
cores and leaves the rest (``VLLM_CPU_NUM_OF_RESERVED_CPU``) to the scheduler and the
front end. A thread inherits the cores of the thread that starts it, so a helper started
from the engine thread would share the forward pass's cores while the reserved ones
idle. Each helper thread therefore moves, as it starts, to the cores its process's
parent may use that the engine thread does not (none spare: it stays), and lowers its
priority, so that whatever it shares, the forward pass comes first. Cores a sibling
process is bound to (another tensor- or data-parallel worker's forward pass: bound to
part of the parent's cores) are not spare either.

On an accelerator the worker is not bound: nothing moves, only the priority drops.

Each helper also takes its Python name as its system name (Linux, 15 characters:
``kvmux-disk-save``), so ``top -H``, ``ps -L`` and profilers tell it from the engine's.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "HELPER_NICE",
    "SYSTEM_NAME_LENGTH",
    "child_pids",
    "has_spare_core",
    "in_background",
    "sibling_cores",
    "spare_cores",
]

log = logging.getLogger(__name__)
HELPER_NICE = 10  # helper threads' CPU priority (Linux): the forward pass's threads come first
SYSTEM_NAME_LENGTH = 15  # characters of a thread's system name (Linux: 16 bytes with the NUL)


def spare_cores(own: set[int], allowed: set[int], siblings: Iterable[set[int]] = ()) -> set[int]:
    """The cores of ``allowed`` outside ``own`` and outside every sibling bound to part of
    ``allowed`` (another worker's forward pass); ``own`` itself if none are."""
    taken = set(own)
    for cores in siblings:
        if cores < allowed:  # a sibling with all the parent's cores is not bound
            taken |= cores
    return (allowed - taken) or own


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started, by any of its threads (Linux ``/proc``); [] if unknown."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in children.read_text().split()]
        except OSError:  # a thread that ended, or a kernel without the file
            continue
    return found


def sibling_cores() -> list[set[int]]:
    """The cores of the other processes the parent started (Linux ``/proc``); [] if unknown."""
    me = os.getpid()
    found = []
    for pid in child_pids(os.getppid()):
        if pid == me:
            continue
        try:
            found.append(os.sched_getaffinity(pid))
        except OSError:  # ended meanwhile
            continue
    return found


def _spare_of_this_thread() -> tuple[set[int], set[int]]:
    """This thread's cores, and the cores a helper of it may move to."""
    own = os.sched_getaffinity(0)
    return own, spare_cores(own, os.sched_getaffinity(os.getppid()), sibling_cores())


def has_spare_core() -> bool:
    """Whether a helper thread started now would run off the calling thread's cores.

    True where vLLM bound the forward pass to some cores and left others (its
    multi-process layout on a CPU); False in-process, off Linux, or if unknown.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        own, spare = _spare_of_this_thread()
        return spare != own
    except OSError:
        return False


def in_background() -> None:
    """Move the calling (new) thread off the forward pass's cores, lower its priority and
    give it its Python name as its system name.

    Linux only; elsewhere, or if the system refuses, the thread keeps its cores, priority
    and name.
    """
    if not sys.platform.startswith("linux"):
        return
    _name_this_thread(threading.current_thread().name)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HELPER_NICE)
    except OSError:  # not allowed: normal priority
        log.debug("kvmux: could not lower a helper thread's priority", exc_info=True)
    try:
        own, target = _spare_of_this_thread()
        if target != own:
            os.sched_setaffinity(0, target)
    except OSError:  # the parent is gone or not ours to read: the thread stays
        log.debug("kvmux: could not move a helper thread off the engine's cores", exc_info=True)


def _name_this_thread(name: str) -> None:
    """Set the calling thread's system name (``/proc``'s ``comm``) to ``name``, cut short."""
    tid = threading.get_native_id()
    try:
        with open(f"/proc/self/task/{tid}/comm", "w", encoding="ascii", errors="replace") as comm:
            comm.write(name[:SYSTEM_NAME_LENGTH])
    except OSError:  # not allowed, or no /proc: the inherited name stays
        log.debug("kvmux: could not name a helper thread", exc_info=True)
