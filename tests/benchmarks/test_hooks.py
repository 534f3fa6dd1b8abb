"""The hooks microbenchmark: both connectors driven through the same steps, side by side.

Nothing here looks at how long anything took; only that the measurement ran and is fair.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm")

from benchmarks.hooks import (
    BenchSettings,
    Driver,
    Pair,
    _children_of,
    format_table,
    main,
    measure_hooks,
)

TINY = BenchSettings(arrivals=1.5, lifetime=3, layers=2, steps=4, rounds=2, warmup_steps=2)


@pytest.mark.parametrize("kind", ["tier", "foreign"])
def test_both_connectors_give_their_children_the_same_work(kind: str) -> None:
    drivers = [
        Driver(Pair.build(top, 2, kind), 2, TINY) for top in ("MuxConnector", "MultiConnector")
    ]
    for driver in drivers:
        driver.run(12)
    mux, multi = ([c.totals for c in _children_of(d.pair.worker)] for d in drivers)
    for a, b in zip(mux, multi, strict=True):
        assert a["loaded"] == b["loaded"] and a["saved"] == b["saved"]
        if kind == "foreign":  # a kvmux tier works per step, not per layer: Mux skips those
            assert a["layers"] == b["layers"] > 0
    sched_mux, sched_multi = ([c.totals for c in _children_of(d.pair.scheduler)] for d in drivers)
    for a, b in zip(sched_mux, sched_multi, strict=True):
        assert a["lookups"] == b["lookups"] > 0
        assert a["finished"] == b["finished"] > 0


def test_measure_hooks_reports_both_sides() -> None:
    row = measure_hooks(1, "tier", TINY)
    assert row["rounds"] == TINY.rounds
    for side in ("scheduler", "worker"):
        for key in ("mux_us", "multi_us", "ratio"):
            assert math.isfinite(row[f"{side}_{key}"])
    table = format_table([row])
    assert table.count("\n") == 2 and "| 1 | tier |" in table


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--children", "1", "--workload", "decode", "--rounds", "1", "--steps", "2"]
    assert main(argv) == 0
    assert "| 1 | tier | 0.5 |" in capsys.readouterr().out
