"""Sizes, ages and durations as operators read and type them."""

from __future__ import annotations

import re

from kvmux.errors import ConfigError

__all__ = ["format_age", "format_size", "parse_duration"]

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_DURATION_HELP = "a number with s, m, h, d or w, e.g. 90s, 30m, 12h, 7d, 1d12h"


def parse_duration(text: str, key: str = "--older-than") -> float:
    """Seconds in a duration such as ``7d``, ``12h``, ``30m``, ``90s`` or ``1d12h``."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(key, f"bad duration {text!r}", _DURATION_HELP)
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def format_size(size: int) -> str:
    """Bytes in powers of 1024, e.g. ``2.0 MiB``."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_age(seconds: float | None) -> str:
    """A short age, e.g. ``42s``, ``12m``, ``3h05m``, ``4d03h``; ``-`` if unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
