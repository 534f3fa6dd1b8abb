"""kvmux's log records go where vLLM's go: same handlers, same level."""

from __future__ import annotations

import logging

__all__ = ["adopt_vllm_logging"]

_ADOPTED = "_kvmux_adopted_handlers"  # on the kvmux logger: the vLLM handlers it took


def adopt_vllm_logging() -> None:
    """Give the ``kvmux`` logger vLLM's handlers and level, unless it has its own.

    vLLM configures only its own ``vllm`` logger; without this, kvmux's INFO lines (its
    periodic stats among them) never reach vLLM's log, and its warnings reach stderr
    unformatted. A user's own logging configuration of ``kvmux`` is left alone. Called
    when kvmux's adapter is imported (vLLM's plugin loader may do that before vLLM has
    set up its handlers) and again by each connector: handlers vLLM has replaced since
    are followed.
    """
    ours, theirs = logging.getLogger("kvmux"), logging.getLogger("vllm")
    adopted = getattr(ours, _ADOPTED, None)
    if (ours.handlers and ours.handlers != adopted) or not theirs.handlers:
        return  # the user's own handlers, or nothing to take yet
    current = list(theirs.handlers)
    if adopted == current:
        return
    for handler in list(ours.handlers):
        ours.removeHandler(handler)
    for handler in current:
        ours.addHandler(handler)
    setattr(ours, _ADOPTED, current)
    if ours.level == logging.NOTSET or adopted is not None:
        ours.setLevel(theirs.getEffectiveLevel())
