"""The reserved-cores benchmark's table (the measurement itself starts engines)."""

from __future__ import annotations

from benchmarks.reserved_cpu import CASES, format_table


def test_the_cases_compare_the_default_reservation_with_one_core() -> None:
    names = [name for name, _, _ in CASES]
    assert names[0] == "no connector" and CASES[0][1] is None
    assert [reserved for _, _, reserved in CASES] == [None, None, "1"]


def test_the_table_shows_medians_and_ratios() -> None:
    rows = [
        {"case": "no connector", "ms_per_token": 6.2, "ratio_to_no_connector": 1.0},
        {"case": "kvmux memory tier", "ms_per_token": 13.3, "ratio_to_no_connector": 2.145},
    ]
    assert format_table(rows).splitlines()[2:] == [
        "| no connector | 6.2 | 1.00 |",
        "| kvmux memory tier | 13.3 | 2.15 |",
    ]
