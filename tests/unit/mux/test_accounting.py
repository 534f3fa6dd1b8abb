"""kvmux.mux.accounting: each request finished once, after all its children."""

from __future__ import annotations

from kvmux.mux.accounting import FinishTracker


def test_done_only_after_every_expected_child() -> None:
    t = FinishTracker()
    t.expect("r", [0, 2])
    assert t.report(2, ["r"]) == set()
    assert t.ignored == 0
    assert t.report(0, ["r"]) == {"r"}
    assert t.ignored == 0
    assert t.report(0, ["r"]) == set()  # done: nobody owes it any more
    assert t.ignored == 1


def test_several_requests_in_one_report() -> None:
    t = FinishTracker()
    t.expect("a", [0])
    t.expect("b", [0, 1])
    assert t.report(0, ["a", "b"]) == {"a"}
    assert t.report(1, {"b"}) == {"b"}


def test_expect_twice_adds_children() -> None:
    t = FinishTracker()
    t.expect("r", [0])
    t.expect("r", [1])
    assert t.report(0, ["r"]) == set()
    assert t.report(1, ["r"]) == {"r"}


def test_expect_nobody_waits_for_nothing() -> None:
    t = FinishTracker()
    t.expect("r", [])
    assert t.report(0, ["r"]) == set()
    assert t.ignored == 1


def test_duplicates_are_ignored_and_counted() -> None:
    t = FinishTracker()
    t.expect("r", [0, 1])
    assert t.report(0, ["r"]) == set()
    assert t.report(0, ["r"]) == set()  # duplicate before completion
    assert t.ignored == 1
    assert t.report(1, ["r"]) == {"r"}
    assert t.report(1, ["r"]) == set()  # duplicate after completion
    assert t.report(0, ["r"]) == set()
    assert t.ignored == 3


def test_strays_are_ignored() -> None:
    t = FinishTracker()
    t.expect("r", [0])
    assert t.report(1, ["r"]) == set()  # a child that owes nothing
    assert t.report(0, ["other"]) == set()  # a request nobody waits for
    assert t.ignored == 2
    assert t.report(0, ["r"]) == {"r"}  # still waiting for child 0


def test_failed_flag_carried_to_take_failed() -> None:
    t = FinishTracker()
    t.expect("bad", [0, 1])
    t.expect("good", [0, 1])
    assert t.report(0, ["bad"], failed=True) == set()
    assert t.report(0, ["good"]) == set()
    done = t.report(1, ["bad", "good"])
    assert done == {"bad", "good"}
    assert t.take_failed(done) == {"bad"}
    assert t.take_failed(done) == set()  # taken once


def test_take_failed_only_of_the_given_requests() -> None:
    t = FinishTracker()
    t.expect("a", [0])
    t.expect("b", [0])
    done = t.report(0, ["a", "b"], failed=True)
    assert t.take_failed(["a"]) == {"a"}
    assert t.take_failed(done) == {"b"}


def test_ignored_failed_report_does_not_mark_failed() -> None:
    t = FinishTracker()
    t.expect("r", [0])
    t.report(1, ["r"], failed=True)
    assert t.report(0, ["r"]) == {"r"}
    assert t.take_failed(["r"]) == set()


def test_abandon_child() -> None:
    t = FinishTracker()
    t.expect("solo", [1])
    t.expect("pair", [0, 1])
    t.expect("other", [0])
    assert t.abandon_child(1) == {"solo"}
    assert t.report(1, ["pair", "solo"]) == set()  # it owes nothing any more
    assert t.ignored == 2
    assert t.report(0, ["pair", "other"]) == {"pair", "other"}
    assert t.take_failed({"solo", "pair", "other"}) == {"solo", "pair"}


def test_abandon_a_child_that_owes_nothing() -> None:
    t = FinishTracker()
    t.expect("r", [0])
    assert t.abandon_child(3) == set()
    assert t.ignored == 0
    assert t.report(0, ["r"]) == {"r"}
