"""kvmux's log records go where vLLM's go: same handlers, same level."""

from __future__ import annotations

import logging

__all__ = ["adopt_vllm_logging"]


def adopt_vllm_logging() -> None:
    """Give the ``kvmux`` logger vLLM's handlers and level, unless it has its own.

    vLLM configures only its own ``vllm`` logger; without this, kvmux's INFO lines (its
    periodic stats among them) never reach vLLM's log, and its warnings reach stderr
    unformatted. A user's own logging configuration of ``kvmux`` is left alone.
    """
    ours, theirs = logging.getLogger("kvmux"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.getEffectiveLevel())
