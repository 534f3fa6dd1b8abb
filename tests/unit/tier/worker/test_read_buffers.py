"""ReadBuffers: buffers lent for a load are reused, within a bound of bytes kept."""

from __future__ import annotations

import pytest

from kvmux.tier.worker.read_buffers import ReadBuffers


def test_buffers_taken_back_are_lent_again() -> None:
    buffers = ReadBuffers(16, kept_bytes=64)
    with buffers.lend(3) as first:
        assert [len(b) for b in first] == [16, 16, 16]
        assert len({id(b) for b in first}) == 3
    with buffers.lend(2) as again:
        assert all(any(b is f for f in first) for b in again)
    with buffers.lend(0) as none:
        assert none == []


def test_no_more_than_the_bound_is_kept() -> None:
    buffers = ReadBuffers(16, kept_bytes=32)  # two buffers
    with buffers.lend(5) as many:
        pass
    with buffers.lend(5) as again:
        reused = [b for b in again if any(b is m for m in many)]  # `many` keeps them alive
    assert len(reused) == 2


def test_at_least_one_buffer_is_kept_and_a_failed_load_gives_them_back() -> None:
    buffers = ReadBuffers(1024, kept_bytes=1)
    with pytest.raises(RuntimeError), buffers.lend(1) as lent:
        raise RuntimeError("the load failed")
    with buffers.lend(1) as again:
        assert again[0] is lent[0]
