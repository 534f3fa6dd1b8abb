"""The engine runner's hook timing (``kvmux.testing.runner``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvmux.testing import runner


class Connector:
    def take_events(self) -> Iterator[int]:
        yield from (1, 2)

    def has_pending_push_work(self) -> bool:
        return False


@pytest.fixture(autouse=True)
def fresh_times() -> Iterator[None]:
    runner._hook_seconds.clear()
    yield
    runner._hook_seconds.clear()


def test_a_generator_hook_runs_inside_its_timing() -> None:
    """MultiConnector's take_events is a generator: its work is timed, not left to the caller."""
    connector: Any = Connector()
    runner._timed(connector, "take_events", "scheduler/top")
    assert connector.take_events() == [1, 2]
    assert runner._hook_seconds["scheduler/top/take_events/calls"] == 1


def test_a_hook_this_release_lacks_is_left_untimed() -> None:
    connector: Any = Connector()
    runner._timed(connector, "no_such_hook", "scheduler/top")
    assert not hasattr(connector, "no_such_hook")
    runner._timed(connector, "has_pending_push_work", "scheduler/top")
    assert connector.has_pending_push_work() is False
    assert runner._hook_seconds["scheduler/top/has_pending_push_work/calls"] == 1
