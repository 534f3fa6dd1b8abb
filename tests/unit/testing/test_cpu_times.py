"""CPU seconds of a process tree, by role."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvmux.testing.cpu_times import cpu_seconds, process_tree, role_of

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def test_a_kvmux_helper_is_a_helper_in_any_process() -> None:
    assert role_of("VLLM::Worker", "kvmux-disk-save", False) == "kvmux helper threads"
    assert role_of("python", "kvmux-redis-sav", True) == "kvmux helper threads"


def test_other_threads_take_their_process_role() -> None:
    assert role_of("VLLM::Worker", "VLLM::Worker", False) == "forward pass (worker)"
    assert role_of("VLLM::EngineCor", "gloo_tcp_loop", False) == "engine core"
    assert role_of("python", "python", True) == "front end"
    assert role_of("redis-server", "bio_close_file", False) == "redis-server"


@linux_only
def test_the_tree_holds_a_child_and_its_cpu_is_counted() -> None:
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    burn += "time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            seconds = cpu_seconds([child.pid])
            if sum(seconds.values()) >= 0.25:
                break
            time.sleep(0.05)
        assert child.pid in process_tree(os.getpid())
        assert sum(seconds.values()) >= 0.25
        assert "front end" in cpu_seconds([os.getpid()], front_end=os.getpid())
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_counts_nothing() -> None:
    assert cpu_seconds([2**22 + 12345]) == {}
