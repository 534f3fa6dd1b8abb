"""kvmux.tier.worker.staging.StagingBuffers: host buffers reused once the device has read them."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvmux.tier.worker.staging import StagingBuffers


class _Read:
    """An event after a copy that reads a buffer: done or not yet."""

    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


def test_a_buffer_is_lent_again_only_once_the_device_has_read_it() -> None:
    buffers = StagingBuffers(pin=False)
    first = buffers.take(100)
    read = _Read(done=False)
    buffers.give_back(first, read)
    second = buffers.take(100)  # the copy from the first may still run: a new buffer
    assert second.data_ptr() != first.data_ptr()
    buffers.give_back(second, None)
    read.done = True
    again = {buffers.take(100).data_ptr(), buffers.take(100).data_ptr()}
    assert again == {first.data_ptr(), second.data_ptr()}


def test_a_small_buffer_is_not_lent_for_a_larger_copy() -> None:
    buffers = StagingBuffers(pin=False)
    small = buffers.take(10)
    buffers.give_back(small, None)
    assert buffers.take(20).numel() == 20


def test_at_most_kept_buffers_stay_and_the_larger_ones_win() -> None:
    buffers = StagingBuffers(pin=False, kept=2)
    taken = [buffers.take(size) for size in (10, 30, 20)]
    for buffer in taken:
        buffers.give_back(buffer, None)
    assert sorted(b.numel() for b, _ in buffers._free) == [20, 30]
    assert buffers.kept_bytes == 50
