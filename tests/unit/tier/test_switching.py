"""The interpreter's switch interval while asynchronous loads run (kvmux.tier.switching)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from kvmux.tier.switching import LOADING_SWITCH_SECONDS, quick_switching

DEFAULT = 0.005  # CPython's own


@pytest.fixture(autouse=True)
def default_interval() -> Iterator[None]:
    saved = sys.getswitchinterval()
    sys.setswitchinterval(DEFAULT)
    yield
    sys.setswitchinterval(saved)


def test_a_load_shortens_the_interval_and_gives_it_back() -> None:
    with quick_switching():
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_SECONDS)
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


def test_the_interval_stays_short_until_the_last_load_ends() -> None:
    first_in, first_may_end, second_ended = threading.Event(), threading.Event(), []

    def first() -> None:
        with quick_switching():
            first_in.set()
            assert first_may_end.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with quick_switching():  # a second load, on another tier's loader
        pass
    second_ended.append(sys.getswitchinterval())
    first_may_end.set()
    thread.join()
    assert second_ended == [pytest.approx(LOADING_SWITCH_SECONDS)]  # the first still ran
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


def test_a_shorter_interval_is_left_alone() -> None:
    shorter = LOADING_SWITCH_SECONDS / 2
    sys.setswitchinterval(shorter)
    with quick_switching():
        assert sys.getswitchinterval() == pytest.approx(shorter)
    assert sys.getswitchinterval() == pytest.approx(shorter)


def test_an_interval_someone_else_set_meanwhile_is_kept() -> None:
    with quick_switching():
        sys.setswitchinterval(0.002)  # e.g. the application's own choice
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_an_error_within_still_gives_the_interval_back() -> None:
    with pytest.raises(RuntimeError), quick_switching():
        raise RuntimeError("a load that failed")
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)
