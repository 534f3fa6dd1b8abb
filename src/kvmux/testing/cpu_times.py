"""CPU seconds of a process tree, by role: where an engine's time goes (Linux ``/proc``).

A role is read off names: a thread named ``kvmux-...`` is one of kvmux's helper threads
(``tier/worker/threads.py`` names them); otherwise the process's name says it: vLLM's worker
(``VLLM::Worker``: the forward pass), its engine core (``VLLM::EngineCore``), the process
that asked (the front end), or any other process by its own name (``redis-server``).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from kvmux.tier.worker.threads import child_pids

__all__ = ["ROLES", "cpu_seconds", "process_tree", "role_of"]

ROLES = {  # process name (as /proc shows it: 15 characters) -> role
    "VLLM::Worker": "forward pass (worker)",
    "VLLM::EngineCor": "engine core",
}
HELPER_PREFIX = "kvmux-"
HELPERS = "kvmux helper threads"
FRONT_END = "front end"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (those that ended meanwhile left out)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += child_pids(current)
    return found


def role_of(process: str, thread: str, is_front_end: bool) -> str:
    """The role of a thread, from its name and its process's."""
    if thread.startswith(HELPER_PREFIX):
        return HELPERS
    if is_front_end:
        return FRONT_END
    return ROLES.get(process, process)


def _thread_stats(pid: int) -> Iterable[tuple[str, float]]:
    """(thread name, CPU seconds) of every thread of ``pid``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        yield name, (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def cpu_seconds(pids: Iterable[int], front_end: int | None = None) -> dict[str, float]:
    """CPU seconds used so far by the threads of ``pids``, added up by role."""
    totals: dict[str, float] = defaultdict(float)
    for pid in pids:
        try:
            process = Path(f"/proc/{pid}/comm").read_text().strip()
            for thread, seconds in _thread_stats(pid):
                totals[role_of(process, thread, pid == front_end)] += seconds
        except OSError:  # the process ended
            continue
    return dict(totals)
