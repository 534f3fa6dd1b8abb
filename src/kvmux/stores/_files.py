"""File helpers the file-backed stores share."""

from __future__ import annotations

from pathlib import Path

__all__ = ["remove_file"]


def remove_file(path: Path) -> OSError | None:
    """Remove ``path``; the error if it could not be removed (a vanished file is removed)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None
