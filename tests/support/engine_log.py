"""Reading an engine's log in tests: the tracebacks it printed, minus vLLM's known noise."""

from __future__ import annotations

import re

# vLLM's renderer warm-up logs this traceback whenever the tokenizer is skipped.
KNOWN_NOISE = ("Tokenizer not available when `skip_tokenizer_init=True`",)
_PREFIX = re.compile(r"^(\(\S+ pid=\d+\) )?(\w+ \d\d-\d\d [\d:]+ \[[^\]]+\] )?")


def tracebacks(log: str) -> list[str]:
    """Every traceback in ``log``, each as its lines without vLLM's log prefix."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for raw in log.splitlines():
        line = _PREFIX.sub("", raw)
        if line.startswith("Traceback (most recent call last)"):
            current = [line]
            blocks.append(current)
        elif current is not None:
            current.append(line)
            if line and not line.startswith((" ", "During handling", "The above")):
                current = None  # the exception line ends the block
    return ["\n".join(block) for block in blocks]


def unexpected_tracebacks(log: str) -> list[str]:
    """The tracebacks in ``log`` that are not vLLM's known, harmless noise."""
    return [block for block in tracebacks(log) if not any(n in block for n in KNOWN_NOISE)]
