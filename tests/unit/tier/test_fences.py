"""kvmux.tier.fences: a step waits for a save's copies only where it reuses their blocks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvmux.tier.fences import FENCE_STEPS, InFlightSaves, SavedBlocks

STREAMS = ("forward", "loader")  # the streams that write the KV cache, as a worker names them


class Mark:
    """A save in flight; records which streams a step ordered after it (never the host)."""

    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def wait(self) -> None:
        pytest.fail("a fence must not make the host wait")

    def order(self, streams: Sequence[object]) -> None:
        assert tuple(streams) == STREAMS  # every writer of the KV cache, not only one
        self.log.append(self.name)


def test_an_allocated_block_is_fenced_by_the_latest_step_that_saved_it() -> None:
    saved = SavedBlocks()
    saved.saved(1, [4, 5])
    saved.saved(2, [5, 6])
    saved.saved(3, [])  # nothing saved: nothing remembered
    assert saved.fence(4, [9, 5]) == 2
    assert saved.fence(4, [4]) == 1
    assert saved.fence(4, [7, 8]) == 0
    assert saved.fence(4, []) == 0


def test_saves_older_than_the_window_are_forgotten() -> None:
    saved = SavedBlocks()
    saved.saved(1, [4])
    assert saved.fence(FENCE_STEPS, [4]) == 1
    assert saved.fence(FENCE_STEPS + 1, [4]) == 0  # the workers ordered step 1 by now


def test_a_step_waits_only_for_what_it_reuses() -> None:
    log: list[str] = []
    marks = InFlightSaves()
    marks.saved(1, Mark("s1", log))
    marks.saved(2, Mark("s2", log))
    marks.saved(3, None)  # done on the host: nothing in flight
    marks.before_step(4, 0, STREAMS)
    assert log == [] and marks
    marks.before_step(4, 1, STREAMS)
    assert log == ["s1"]  # step 2's copies still run beside the forward pass
    marks.before_step(5, 2, STREAMS)
    assert log == ["s1", "s2"] and not marks


def test_one_wait_covers_every_earlier_save() -> None:
    log: list[str] = []
    marks = InFlightSaves()
    for step in (1, 2, 3):
        marks.saved(step, Mark(f"s{step}", log))
    marks.before_step(4, 3, STREAMS)
    assert log == ["s3"] and not marks  # one stream: step 3's copies end after 1's and 2's


def test_saves_past_the_window_are_waited_for_whatever_the_fence() -> None:
    log: list[str] = []
    marks = InFlightSaves()
    marks.saved(1, Mark("s1", log))
    marks.saved(2, Mark("s2", log))
    marks.before_step(FENCE_STEPS, 0, STREAMS)
    assert log == []
    marks.before_step(FENCE_STEPS + 1, 0, STREAMS)  # the scheduler forgot step 1
    assert log == ["s1"] and marks
