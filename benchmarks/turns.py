"""Two engines alive side by side, taking turns: comparisons a slow spell hits alike.

Engines started one after the other meet the machine in different moods: on these shared
machines an engine without a connector alone ran at 1686 to 1914 tok/s within one run,
more than a 5% bar either way. Here both engines start together, run a prelude (warm-up,
whatever must be computed first), then take turns, round by round, the order reversed
every other round. Turns are handed over through files (the runner's ``touch`` and
``wait_file`` steps); the engine whose turn it is waits a pause first, in which the
other's background work (kvmux's writes of its last step) ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Protocol

from benchmarks.profiles import BenchPlan

__all__ = ["TurnResult", "take_turns", "turn_order"]

WAIT_S = 1800.0  # how long an engine waits for its turn at most

Steps = list[dict[str, Any]]


class BenchRunner(Protocol):
    """What the turns need of ``e2e.Runner``."""

    plan: BenchPlan

    def tokens(self, seed: int, count: int) -> list[int]:
        """Deterministic random prompt tokens."""
        ...

    def run(self, config: str, steps: Steps, **engine: Any) -> dict[str, Any]:
        """One engine of ``config`` through ``steps``."""
        ...


TurnResult = dict[str, list[list[dict[str, Any]]] | str]  # config -> generates per turn, or error


def turn_order(rounds: int, configs: Sequence[str]) -> list[tuple[str, int]]:
    """The turns (config, round): every round each config once, every other one reversed."""
    return [
        (config, round_)
        for round_ in range(rounds)
        for config in (configs if round_ % 2 == 0 else configs[::-1])
    ]


def _script(
    config: str,
    other: str,
    prelude: Steps,
    turn: Callable[[str, int], Steps],
    order: list[tuple[str, int]],
    sync: Path,
    pause: float,
) -> tuple[Steps, list[range]]:
    """One engine's steps: its prelude, then its turns, each after the turn before, then
    the wait for the last turn; and where each turn's own steps are, in round order."""
    steps = [*prelude, {"op": "touch", "path": str(sync / f"ready-{config}")}]
    spans: list[range] = []
    for index, (owner, _) in enumerate(order):
        if owner != config:
            continue
        before = f"turn-{index - 1}" if index else f"ready-{other}"
        steps += [
            {"op": "wait_file", "path": str(sync / before), "timeout": WAIT_S},
            {"op": "sleep", "seconds": pause},
        ]
        own = turn(config, len(spans))
        spans.append(range(len(steps), len(steps) + len(own)))
        steps += [*own, {"op": "touch", "path": str(sync / f"turn-{index}")}]
    # an engine that exits early would shut down during the other's last turn
    steps.append(
        {"op": "wait_file", "path": str(sync / f"turn-{len(order) - 1}"), "timeout": WAIT_S}
    )
    return steps, spans


def _turn_generates(steps: Steps, spans: list[range], results: list[dict[str, Any]]) -> list[Steps]:
    """The generate results of each turn: the runner answers every step in order, after
    steps of its own (its start, a warm-up) that come first."""
    offset = len(results) - len(steps)
    return [[results[offset + i] for i in span if steps[i]["op"] == "generate"] for span in spans]


def _release_all(sync: Path, configs: Sequence[str], turns: int) -> None:
    """Every file an engine may wait for: no engine waits for one that failed."""
    for name in [f"ready-{c}" for c in configs] + [f"turn-{t}" for t in range(turns)]:
        (sync / name).touch()


def take_turns(
    runner: BenchRunner,
    configs: tuple[str, str],
    prelude: Callable[[str], Steps],
    turn: Callable[[str, int], Steps],
    rounds: int,
    pause: float,
    **engine: Any,
) -> TurnResult:
    """Both engines through ``prelude`` and ``rounds`` rounds of ``turn``s, side by side.

    Returns, per config, the generate results of each of its turns in round order, or
    the error that stopped its engine (the other then runs on without waiting).
    """
    order = turn_order(rounds, configs)
    with TemporaryDirectory(prefix="kvmux-turns-") as tmp, ThreadPoolExecutor(2) as pool:
        sync = Path(tmp)
        scripts = {
            config: _script(config, other, prelude(config), turn, order, sync, pause)
            for config, other in (configs, configs[::-1])
        }
        futures = {
            config: pool.submit(runner.run, config, steps, **engine)
            for config, (steps, _) in scripts.items()
        }
        wait(futures.values(), return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures.values()):
            _release_all(sync, configs, len(order))
        result: TurnResult = {}
        for config, future in futures.items():
            error = future.exception()
            if error is None:
                result[config] = _turn_generates(*scripts[config], future.result()["steps"])
            else:
                result[config] = f"{type(error).__name__}: {str(error).splitlines()[0][:800]}"
    return result
