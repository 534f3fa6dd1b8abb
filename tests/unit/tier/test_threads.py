"""Helper threads leave the forward pass's cores and run at a lower priority."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from kvmux.tier.threads import HELPER_NICE, has_spare_core, in_background, spare_cores

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux affinity")


def test_spare_cores_are_the_allowed_ones_outside_the_engines() -> None:
    assert spare_cores({0}, {0, 1, 2, 3}) == {1, 2, 3}
    assert spare_cores({0, 1}, {0, 1, 2}) == {2}


def test_without_spare_cores_a_helper_keeps_its_own() -> None:
    assert spare_cores({0, 1}, {0, 1}) == {0, 1}
    assert spare_cores({0}, {0}) == {0}


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
