"""kvmux's log records reach vLLM's handlers."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from kvmux.vllm.logs import adopt_vllm_logging


@pytest.fixture
def loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    ours, theirs = logging.getLogger("kvmux"), logging.getLogger("vllm")
    saved = (list(ours.handlers), ours.level, list(theirs.handlers), theirs.level)
    ours.handlers, theirs.handlers = [], []
    ours.setLevel(logging.NOTSET)
    yield ours, theirs
    ours.handlers, theirs.handlers = saved[0], saved[2]
    ours.setLevel(saved[1])
    theirs.setLevel(saved[3])


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_kvmux_info_lines_reach_vllms_handler(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    _, theirs = loggers
    collect = Collect()
    theirs.addHandler(collect)
    theirs.setLevel(logging.INFO)
    adopt_vllm_logging()
    adopt_vllm_logging()  # once is enough: no second copy of each line
    logging.getLogger("kvmux.mux").info("kvmux mux stats: %s", {"0:memory": {}})
    assert collect.lines == ["kvmux mux stats: {'0:memory': {}}"]


def test_a_users_own_kvmux_logging_is_left_alone(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    ours, theirs = loggers
    mine, vllms = Collect(), Collect()
    ours.addHandler(mine)
    theirs.addHandler(vllms)
    adopt_vllm_logging()
    assert ours.handlers == [mine]


def test_handlers_vllm_replaced_after_kvmux_was_imported_are_followed(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    """vLLM's plugin loader imports kvmux early; vLLM may set up its handlers later."""
    _, theirs = loggers
    early, late = Collect(), Collect()
    theirs.addHandler(early)
    adopt_vllm_logging()  # at import
    theirs.removeHandler(early)
    theirs.addHandler(late)
    theirs.setLevel(logging.INFO)
    adopt_vllm_logging()  # a connector is built
    logging.getLogger("kvmux.tier").info("save queue: 2 steps")
    assert late.lines == ["save queue: 2 steps"] and early.lines == []
