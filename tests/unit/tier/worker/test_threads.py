"""Helper threads leave the forward pass's cores and run at a lower priority."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvmux.tier.worker import transfer
from kvmux.tier.worker.threads import (
    HELPER_NICE,
    has_spare_core,
    in_background,
    sibling_cores,
    spare_cores,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux affinity")


def test_spare_cores_are_the_allowed_ones_outside_the_engines() -> None:
    assert spare_cores({0}, {0, 1, 2, 3}) == {1, 2, 3}
    assert spare_cores({0, 1}, {0, 1, 2}) == {2}


def test_without_spare_cores_a_helper_keeps_its_own() -> None:
    assert spare_cores({0, 1}, {0, 1}) == {0, 1}
    assert spare_cores({0}, {0}) == {0}


def test_cores_a_sibling_worker_is_bound_to_are_not_spare() -> None:
    """Another tensor-parallel worker's forward pass runs on the cores it is bound to."""
    assert spare_cores({0}, {0, 1, 2, 3}, [{1}]) == {2, 3}
    assert spare_cores({0}, {0, 1, 2, 3}, [{1}, {2, 3}]) == {0}  # none left: its own


def test_a_sibling_with_all_the_parents_cores_is_not_bound() -> None:
    assert spare_cores({0}, {0, 1, 2, 3}, [{0, 1, 2, 3}]) == {1, 2, 3}


@linux_only
def test_sibling_cores_reads_the_other_children_of_the_parent() -> None:
    """A probe and a sleeper bound to one core, both children of this process."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    bound = {cores[-1]}
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        preexec_fn=lambda: os.sched_setaffinity(0, bound),
    )
    try:
        probe = "import json; from kvmux.tier.worker.threads import sibling_cores as s; "
        probe += "print(json.dumps([sorted(c) for c in s()]))"
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert sorted(bound) in json.loads(out.stdout)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert all(isinstance(c, set) for c in sibling_cores())


def _helper_started_from_a_thread_bound_to(core: int) -> tuple[set[int], int]:
    """Affinity and priority of a helper started by a thread bound to ``core``."""
    seen: dict[str, object] = {}

    def helper() -> None:
        in_background()
        seen["cores"] = os.sched_getaffinity(0)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def engine() -> None:  # as vLLM binds the worker's thread to the forward pass's cores
        os.sched_setaffinity(0, {core})
        started = threading.Thread(target=helper)
        started.start()
        started.join()

    bound = threading.Thread(target=engine)
    bound.start()
    bound.join()
    return seen["cores"], seen["nice"]  # type: ignore[return-value]


@linux_only
def test_a_helper_moves_to_the_cores_the_engine_thread_does_not_use() -> None:
    allowed = os.sched_getaffinity(os.getppid()) & os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("needs two cores")
    engine_core = min(allowed)
    cores, nice = _helper_started_from_a_thread_bound_to(engine_core)
    assert cores == os.sched_getaffinity(os.getppid()) - {engine_core}
    if os.getpriority(os.PRIO_PROCESS, 0) <= HELPER_NICE:
        assert nice == HELPER_NICE


@linux_only
def test_a_spare_core_is_one_the_parent_may_use_and_this_thread_may_not() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    seen: dict[str, bool] = {}

    def engine() -> None:  # as vLLM binds the worker's thread to the forward pass's cores
        seen["unbound"] = has_spare_core()
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        seen["bound"] = has_spare_core()

    started = threading.Thread(target=engine)
    started.start()
    started.join()
    assert seen == {"unbound": False, "bound": True}


@linux_only
def test_a_helper_thread_takes_its_python_name_as_its_system_name() -> None:
    """``top -H`` and profilers tell a helper from the engine's threads."""
    seen: list[str] = []

    def run() -> None:
        in_background()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=run, name="kvmux-redis-save_0")
    thread.start()
    thread.join()
    assert seen == ["kvmux-redis-sav\n"]


def test_helper_threads_take_their_creators_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    set_to: list[tuple[str, int]] = []
    monkeypatch.setattr(transfer, "_current_cuda_device", lambda: 3)  # a rank's own device
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: set_to.append((current(), d)))
    start = transfer.on_this_device()  # captured now, on the creating thread
    with ThreadPoolExecutor(1, thread_name_prefix="kvmux-t-save", initializer=start) as pool:
        helper = pool.submit(current).result()
    assert set_to == [(helper, 3)]  # set on the helper thread itself


def test_helper_threads_leave_the_device_alone_without_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(transfer, "_current_cuda_device", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: pytest.fail("set on a CPU engine"))
    with ThreadPoolExecutor(1, initializer=transfer.on_this_device()) as pool:
        pool.submit(current).result()


def current() -> str:
    return threading.current_thread().name
