"""A stand-in for the benchmark's engine runner that plays turn-taking scripts for real."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.profiles import QUICK

__all__ = ["TurnTakingRunner"]


class TurnTakingRunner:
    """Plays each engine's script for real (files touched and waited for), in threads.

    A generate answers ``seconds[config]``; ``log`` records who generated what, in order.
    Like ``e2e.Runner``, it answers a start and a warm-up before the script's steps.
    """

    def __init__(self, seconds: dict[str, float], fail: str | None = None, **plan: Any):
        self.plan = replace(QUICK, **plan)
        self.seconds = seconds
        self.fail = fail
        self.log: list[tuple[str, Any]] = []
        self.scripts: dict[str, list[dict[str, Any]]] = {}  # config -> the steps it ran
        self.lock = threading.Lock()
        self.engines_started = 0

    def tokens(self, seed: int, count: int) -> list[int]:
        return [seed] * count

    def run(self, config: str, steps: list[dict[str, Any]], **_: Any) -> dict[str, Any]:
        with self.lock:
            self.scripts[config] = steps
            self.engines_started += 1
        if config == self.fail:
            raise RuntimeError("engine job exited with 1: boom")
        done: list[dict[str, Any]] = [{"op": "start"}, {"op": "generate", "seconds": 9.0}]
        for step in steps:
            if step["op"] == "wait_file":
                deadline = time.monotonic() + 10
                while not Path(step["path"]).exists():
                    assert time.monotonic() < deadline, f"{config} waited in vain"
                    time.sleep(0.005)
            elif step["op"] == "touch":
                Path(step["path"]).touch()
            elif step["op"] == "generate":
                with self.lock:
                    self.log.append((config, step["prompts"]))
                done.append(
                    {
                        "op": "generate",
                        "seconds": self.seconds[config],
                        "num_cached_tokens": [len(step["prompts"][0])],
                    }
                )
                continue
            done.append({"op": step["op"]})
        return {"steps": done}
