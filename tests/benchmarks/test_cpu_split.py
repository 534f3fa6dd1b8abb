"""The CPU split tool: its steps and its medians."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cpu_split import batch_steps, format_rows, main, split_rows
from benchmarks.e2e import Runner
from benchmarks.profiles import QUICK


def _runner() -> Runner:
    return Runner(QUICK, Path("/nonexistent"), Path("/nonexistent"), None, {})


def test_each_batch_sits_between_two_cpu_readings() -> None:
    steps = batch_steps(_runner(), 2, [42])
    ops = [s["op"] for s in steps]
    assert ops == ["generate", "sleep"] + ["cpu_times", "generate", "sleep", "cpu_times"] * 2
    assert all(s["pids"] == [42] for s in steps if s["op"] == "cpu_times")
    generated = [s["prompts"] for s in steps if s["op"] == "generate"]
    assert len({tuple(map(tuple, p)) for p in generated}) == 3  # distinct prompts: all saved
    assert all(len(p) == QUICK.noreuse_prompts for p in generated)


def test_split_rows_takes_medians_of_the_differences() -> None:
    steps = [
        {"op": "generate", "seconds": 0.1},  # the runner's warm-up
        {"op": "generate", "seconds": 9.0},  # the unmeasured batch
    ]
    for index, (batch, used) in enumerate([(8.0, 1.0), (9.0, 3.0), (10.0, 2.0)]):
        before = {"forward pass (worker)": 10.0 * index}
        after = {"forward pass (worker)": 10.0 * index + used, "redis-server": used / 2}
        steps += [
            {"op": "cpu_times", "seconds": before},
            {"op": "generate", "seconds": batch},
            {"op": "cpu_times", "seconds": after},
        ]
    row = split_rows("kvmux-mux-redis", steps)
    assert row["batch_s"] == 9.0
    assert row["cpu_s"] == {"forward pass (worker)": 2.0, "redis-server": 1.0}
    table = format_rows([row])
    assert "| kvmux-mux-redis | 9.00 | 2.00 | 1.00 |" in table


def test_unknown_configs_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--configs", "kvmux-memory,nope"])
    assert "kvmux-mux-redis" in capsys.readouterr().err
