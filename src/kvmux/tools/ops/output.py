"""How the tools print: JSON for programs, aligned tables for people."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from kvmux.tools.ops.scan import Record
from kvmux.tools.ops.units import format_age, format_size

__all__ = ["ENTRY_HEADER", "UNREADABLE", "entry_line", "record_json", "table", "write_json"]

UNREADABLE = "unreadable"  # stands for the namespace of an entry whose header cannot be read
ENTRY_HEADER = f"{'KEY':<32}  {'NAMESPACE':<32}  {'SIZE':>10}  {'AGE':>7}  SIGNED"


def record_json(record: Record) -> dict[str, Any]:
    """One entry as a JSON object (header fields are null when the header is unreadable)."""
    header, entry = record.header, record.entry
    found: dict[str, Any] = {
        "key": entry.key.hex(),
        "namespace": header.namespace if header else None,
        "size": entry.size,
        "age": None if entry.age is None else round(entry.age, 3),
        "signed": header.signed if header else None,
        "kid": header.kid if header else None,
        "layers": header.layers if header else None,
    }
    if record.status is not None:
        found["status"] = record.status
        found["reason"] = record.reason
    return found


def entry_line(record: Record) -> str:
    """One entry as a row under ``ENTRY_HEADER``."""
    header, entry = record.header, record.entry
    namespace = header.namespace if header else UNREADABLE
    signed = (header.kid or "yes") if header and header.signed else "-"
    size, age = format_size(entry.size), format_age(entry.age)
    return f"{entry.key.hex():<32}  {namespace:<32}  {size:>10}  {age:>7}  {signed}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first left-aligned, the others right."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(cells).rstrip()

    return "\n".join(line(row) for row in [headers, *rows])


def write_json(out: TextIO, document: Mapping[str, Any]) -> None:
    """One JSON document, on one line."""
    out.write(json.dumps(document, sort_keys=True) + "\n")
