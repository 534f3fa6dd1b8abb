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


def test_a_held_child_still_owes_until_it_reports() -> None:
    t = FinishTracker()
    t.expect("solo", [1])
    t.expect("pair", [0, 1])
    t.expect("other", [0])
    t.hold(1, until=10.0, failed=True)
    assert t.holding
    assert t.release_expired(9.0) == (set(), {})
    assert t.report(1, ["solo"]) == {"solo"}  # reported itself: the hold ends there
    assert t.report(0, ["pair", "other"]) == {"other"}
    assert t.release_expired(10.0) == ({"pair"}, {1: 1})
    assert not t.holding
    assert t.report(1, ["pair"]) == set()  # let go: a late report is ignored
    assert t.take_failed({"solo", "pair", "other"}) == {"solo", "pair"}


def test_a_request_held_again_keeps_its_first_bound() -> None:
    t = FinishTracker()
    t.expect("early", [0])
    t.hold(0, until=10.0)
    t.expect("late", [0])
    t.hold(0, until=20.0)
    assert t.release_expired(10.0) == ({"early"}, {0: 1})
    assert t.holding
    assert t.release_expired(20.0) == ({"late"}, {0: 1})
    assert t.take_failed(["early", "late"]) == {"early", "late"}  # let go: failed


def test_holding_a_child_that_owes_nothing_holds_nothing() -> None:
    t = FinishTracker()
    t.expect("r", [0])
    t.hold(3, until=1.0, failed=True)
    assert not t.holding
    assert t.release_expired(2.0) == (set(), {})
    assert t.report(0, ["r"]) == {"r"}
    assert t.take_failed(["r"]) == set()
