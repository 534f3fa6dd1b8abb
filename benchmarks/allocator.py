"""The memory allocator of the benchmark's engines: TCMalloc, as vLLM's CPU backend asks.

vLLM's CPU backend preloads the TCMalloc its official wheels bundle (``vllm/libs``), and
its installation guide asks for the system's (``libtcmalloc-minimal4``) otherwise. A
wheel without it leaves the engine on glibc's malloc, which hands large activations back
to the system and takes them again: on the benchmark machines the forward pass then took
from 9,500 to 104,000 page faults a second, by engine, and spent up to a fifth of its time
in the kernel; with TCMalloc, 400 to 2,000. An engine's luck in that lottery moved its
throughput by a third, far more than anything the benchmark compares. So every engine of
a run (kvmux's, its peers', the baselines) gets the same allocator: TCMalloc where it is
installed, and the run records which (``results.json``, ``allocator``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kvmux.errors import KvmuxError

__all__ = [
    "ALLOCATORS",
    "TCMALLOC_NAMES",
    "AllocatorMissing",
    "allocator_env",
    "find_tcmalloc",
    "vllm_tcmalloc",
]

ALLOCATORS = ("auto", "tcmalloc", "system")  # auto: TCMalloc if installed, else the system's
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


class AllocatorMissing(KvmuxError):
    """TCMalloc was asked for and is not installed."""


def find_tcmalloc(dirs: tuple[str, ...] = LIBRARY_DIRS) -> Path | None:
    """The system's TCMalloc library, if installed (Debian: ``libtcmalloc-minimal4``)."""
    for directory in dirs:
        for name in TCMALLOC_NAMES:
            path = Path(directory) / name
            if path.exists():
                return path
    return None


def vllm_tcmalloc() -> Path | None:
    """The TCMalloc vLLM's wheel bundles (and preloads itself on a CPU), if it has one."""
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    for location in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(location, "libs").glob("libtcmalloc*.so*")):
            return path
    return None


def allocator_env(choice: str) -> tuple[str, dict[str, str]]:
    """What a run's engines use, as text for the results, and the environment that sets it.

    ``system`` leaves the engines as they are (vLLM still preloads a TCMalloc of its own
    wheel); ``tcmalloc`` raises AllocatorMissing where none is installed; ``auto`` falls
    back to the system's allocator then.
    """
    if choice not in ALLOCATORS:
        raise ValueError(f"unknown allocator {choice!r}; expected one of {ALLOCATORS}")
    bundled = vllm_tcmalloc()
    if bundled is not None:
        return f"tcmalloc (vLLM's own, {bundled.name})", {}
    if choice == "system":
        return "system (glibc malloc)", {}
    found = find_tcmalloc()
    if found is None:
        if choice == "tcmalloc":
            raise AllocatorMissing(
                "TCMalloc is not installed: apt-get install libtcmalloc-minimal4, "
                "or run with --allocator system"
            )
        return "system (glibc malloc: no TCMalloc installed)", {}
    preload = ":".join(p for p in (str(found), os.environ.get("LD_PRELOAD", "")) if p)
    return f"tcmalloc ({found})", {"LD_PRELOAD": preload}
