"""A one-line progress report on stderr for long walks (no dependency: kvmux stays small)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from kvmux.tools.ops.units import format_size

__all__ = ["Progress"]

_WIDTH = 24  # characters of the bar


class Progress:
    """Entries and bytes done, their rate, and a bar when the total is known."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = 0.2,
    ):
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval = interval  # seconds between redraws
        self.entries = 0
        self.bytes = 0
        self._start = self._drawn = time.monotonic()

    def update(self, entries: int = 1, nbytes: int = 0) -> None:
        """Count work done; redraws at most every ``interval`` seconds."""
        self.entries += entries
        self.bytes += nbytes
        now = time.monotonic()
        if self.enabled and now - self._drawn >= self.interval:
            self._drawn = now
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        """The current report, e.g. ``verify [######----] 60% 600/1,000 entries 1.2 GiB``."""
        elapsed = max((now or time.monotonic()) - self._start, 1e-9)
        done = f"{self.entries:,}"
        bar = ""
        if self.total:
            share = min(self.entries / self.total, 1.0)
            filled = int(share * _WIDTH)
            bar = f" [{'#' * filled}{'-' * (_WIDTH - filled)}] {share:4.0%}"
            done += f"/{self.total:,}"
        rate = self.entries / elapsed
        return f"{self.label}{bar} {done} entries {format_size(self.bytes)} {rate:,.0f}/s"

    def _draw(self, now: float) -> None:
        self.stream.write(f"\r{self.line(now)}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        """Draw the final count and end the line."""
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
