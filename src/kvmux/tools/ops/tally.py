"""Counts, bytes and ages of a group of entries, for ``stats``, ``verify`` and ``purge``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmux.tools.ops.entry import BAD
from kvmux.tools.ops.scan import Record
from kvmux.tools.ops.units import format_age, format_size

__all__ = ["TALLY_HEADERS", "Tally"]

TALLY_HEADERS = ["NAMESPACE", "ENTRIES", "BYTES", "OLDEST", "NEWEST"]


@dataclass
class Tally:
    """Entries, bytes and ages of a group of entries."""

    entries: int = 0
    bytes: int = 0
    oldest: float | None = None  # the largest age, in seconds
    newest: float | None = None  # the smallest age
    signed: int = 0
    bad: int = 0  # entries verified bad

    def add(self, record: Record, bad: frozenset[str] = BAD) -> None:
        """Count one entry; ``bad`` are the statuses counted as bad."""
        self.entries += 1
        self.bytes += record.entry.size
        self.signed += bool(record.header and record.header.signed)
        self.bad += record.status in bad
        age = record.entry.age
        if age is not None:
            self.oldest = age if self.oldest is None else max(self.oldest, age)
            self.newest = age if self.newest is None else min(self.newest, age)

    def to_json(self, verified: bool = False) -> dict[str, Any]:
        """The tally as a JSON object (``bad`` only if the entries were verified)."""
        found: dict[str, Any] = {
            "entries": self.entries,
            "bytes": self.bytes,
            "oldest": None if self.oldest is None else round(self.oldest, 3),
            "newest": None if self.newest is None else round(self.newest, 3),
            "signed": self.signed,
        }
        return {**found, "bad": self.bad} if verified else found

    def row(self, label: str, verified: bool = False) -> list[str]:
        """The tally as a row under ``TALLY_HEADERS`` (and BAD if verified)."""
        row = [label, f"{self.entries:,}", format_size(self.bytes)]
        row += [format_age(self.oldest), format_age(self.newest)]
        return [*row, f"{self.bad:,}"] if verified else row
