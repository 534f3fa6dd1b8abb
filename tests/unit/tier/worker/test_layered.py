"""kvmux.tier.worker.layered.LayerCopies: a step's copies run in layer order beside the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kvmux.tier.worker.layered import LayerCopies


@pytest.fixture
def copies() -> Iterator[LayerCopies]:
    made = LayerCopies("memory")
    yield made
    made.close()


def test_each_layer_waits_for_its_own_copy_only(copies: LayerCopies) -> None:
    done: list[str] = []
    release = threading.Event()

    def slow() -> None:
        release.wait(10)
        done.append("b")

    copies.start([("a", lambda: done.append("a")), ("b", slow)])
    copies.wait("a")  # returns while b's copy is still held back
    assert done == ["a"]
    release.set()
    copies.wait("b")
    copies.wait("z")  # no copy this step: no wait
    outcome = copies.finish()
    assert done == ["a", "b"]
    assert (outcome.failed, outcome.unwaited) == (None, ())
    assert outcome.seconds >= 0.0


def test_a_failing_copy_releases_every_layer_and_stops_the_rest(copies: LayerCopies) -> None:
    done: list[str] = []

    def broken() -> None:
        raise RuntimeError("copy-in broke")

    copies.start([("a", broken), ("b", lambda: done.append("b"))])
    copies.wait("a")
    copies.wait("b")  # never left waiting
    outcome = copies.finish()
    assert isinstance(outcome.failed, RuntimeError)
    assert done == []


def test_layers_never_waited_for_are_reported(copies: LayerCopies) -> None:
    copies.start([("a", lambda: None), ("b", lambda: None)])
    copies.wait("a")
    assert copies.active
    assert copies.finish().unwaited == ("b",)
    assert not copies.active
    assert copies.finish().unwaited == ()  # nothing started since
