"""The four commands over one scan: ``ls``, ``stats``, ``verify`` and ``purge``.

Each prints to ``out`` (a table, or JSON with ``as_json``) and returns the exit status:
0; ``EXIT_BAD`` when ``verify`` found bad entries (removed with ``--delete`` or not);
``EXIT_FAILED`` when some entries could not be removed.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, TextIO

from kvmux.tools.ops.entry import BAD, UNVERIFIED
from kvmux.tools.ops.output import (
    ENTRY_HEADER,
    UNREADABLE,
    entry_line,
    record_json,
    table,
    write_json,
)
from kvmux.tools.ops.remove import Remover
from kvmux.tools.ops.scan import Record, Scan
from kvmux.tools.ops.tally import TALLY_HEADERS, Tally
from kvmux.tools.ops.units import format_size

__all__ = ["EXIT_BAD", "EXIT_FAILED", "ls", "purge", "stats", "verify"]

EXIT_FAILED = 1  # some entries could not be removed (as for any other error)
EXIT_BAD = 3  # verify found bad entries


def ls(scan: Scan, out: TextIO, as_json: bool, limit: int | None = None) -> int:
    """Print each selected entry (at most ``limit``): a table, or one JSON object a line."""
    if not as_json:
        out.write(ENTRY_HEADER + "\n")
    with contextlib.closing(scan.records()) as records:  # ends the progress line at --limit
        for record in islice(records, limit):
            line = (
                json.dumps(record_json(record), sort_keys=True) if as_json else entry_line(record)
            )
            out.write(line + "\n")
    return 0


def stats(scan: Scan, out: TextIO, as_json: bool, tier: dict[str, str]) -> int:
    """Entries, bytes and ages per namespace (and bad entries if the scan verifies)."""
    total, groups = _by_namespace(scan)
    if as_json:
        write_json(out, {**_summary(scan, tier, total, groups), "verified": scan.verify})
        return 0
    out.write(f"{_title(tier)}\n{_namespace_table(total, groups, scan.verify)}\n")
    out.write(_passed_over_line(scan))
    return 0


def verify(
    scan: Scan, out: TextIO, as_json: bool, tier: dict[str, str], delete: bool, strict: bool
) -> int:
    """Check every selected entry; report (and with ``delete`` remove) the bad ones.

    ``strict`` counts entries whose signature cannot be checked (unsigned, or signed with
    a key the tier does not hold) as bad.
    """
    bad_statuses = BAD | (UNVERIFIED if strict else frozenset())
    remover, problems = Remover(scan.store), []

    def each(record: Record) -> None:
        if record.status == "ok":
            return
        problems.append(record)
        if delete and record.status in bad_statuses:
            remover.add(record.entry.key)
        if not as_json:
            out.write(f"{record.status:<11}  {record.entry.key.hex()}  {record.reason}\n")

    total, groups = _by_namespace(scan, each, bad_statuses)
    remover.flush()
    bad = total.bad
    counts = Counter(record.status for record in problems)
    counts["ok"] = total.entries - len(problems)
    if as_json:
        listed = [_problem_json(r, bad_statuses, remover.removed) for r in problems]
        document = {**_summary(scan, tier, total, groups), "counts": dict(counts)}
        write_json(out, {**document, "problems": listed, **remover.to_json()})
    else:
        _verify_lines(out, scan, total, counts, bad, remover, delete)
    if remover.failed:
        return EXIT_FAILED
    return EXIT_BAD if bad else 0


def _problem_json(record: Record, bad: frozenset[str], removed: set[bytes]) -> dict[str, Any]:
    found = {**record_json(record), "bad": record.status in bad}
    return {**found, "removed": record.entry.key in removed}


def _verify_lines(
    out: TextIO,
    scan: Scan,
    total: Tally,
    counts: Counter[str | None],
    bad: int,
    remover: Remover,
    delete: bool,
) -> None:
    found = ", ".join(f"{n:,} {status}" for status, n in sorted(counts.items(), key=str) if n)
    size = format_size(total.bytes)
    out.write(f"checked {_entries(total.entries)} ({size}): {found or 'none'}\n")
    if delete:
        out.write(f"removed {_entries(len(remover.removed), 'bad ')}\n")
    elif bad:
        out.write(f"{_entries(bad, 'bad ')}: remove with --delete\n")
    if scan.signing is None and total.signed:
        out.write(f"{_entries(total.signed, 'signed ')}: checksums checked, signatures not ")
        out.write("(give the tier's signing keys)\n")
    out.write(remover.failures_line() + _passed_over_line(scan))


def purge(scan: Scan, out: TextIO, as_json: bool, tier: dict[str, str], dry_run: bool) -> int:
    """Remove every selected entry (``dry_run``: only report them), per namespace."""
    remover = Remover(scan.store)

    def each(record: Record) -> None:
        if not dry_run:
            remover.add(record.entry.key)

    total, groups = _by_namespace(scan, each)
    remover.flush()
    if as_json:
        document = {**_summary(scan, tier, total, groups), "dry_run": dry_run}
        write_json(out, {**document, **remover.to_json()})
    else:
        verb = "would remove" if dry_run else "removed"
        removed = total.entries - len(remover.failed)
        out.write(f"{_title(tier)}\n{_namespace_table(total, groups, False)}\n")
        out.write(f"{verb} {_entries(removed)} ({format_size(total.bytes)})")
        out.write(" (dry run: nothing removed)\n" if dry_run else "\n")
        out.write(remover.failures_line() + _passed_over_line(scan))
    return EXIT_FAILED if remover.failed else 0


def _by_namespace(
    records: Iterable[Record],
    each: Callable[[Record], None] | None = None,
    bad: frozenset[str] = BAD,
) -> tuple[Tally, dict[str, Tally]]:
    """The total and per-namespace tallies, largest first; ``each`` sees every record."""
    total, groups = Tally(), dict[str, Tally]()
    for record in records:
        namespace = record.header.namespace if record.header else UNREADABLE
        groups.setdefault(namespace, Tally()).add(record, bad)
        total.add(record, bad)
        if each is not None:
            each(record)
    return total, dict(sorted(groups.items(), key=lambda item: (-item[1].bytes, item[0])))


def _summary(
    scan: Scan, tier: dict[str, str], total: Tally, groups: dict[str, Tally]
) -> dict[str, Any]:
    """What every JSON document holds: the tier, totals, namespaces, entries passed over."""
    namespaces = [{"namespace": ns, **t.to_json(scan.verify)} for ns, t in groups.items()]
    return {
        "tier": tier,
        **total.to_json(scan.verify),
        "namespaces": namespaces,
        "passed_over": {
            "unknown_age": scan.unknown_age,
            "unreadable": scan.unreadable,
            "vanished": scan.vanished,
        },
    }


def _namespace_table(total: Tally, groups: dict[str, Tally], verified: bool) -> str:
    headers = TALLY_HEADERS + (["BAD"] if verified else [])
    rows = [tally.row(ns, verified) for ns, tally in groups.items()]
    return table(headers, [*rows, total.row("total", verified)])


def _passed_over_line(scan: Scan) -> str:
    """A note on the entries the scan passed over, or nothing."""
    notes = [
        (scan.unknown_age, "of unknown age"),
        (scan.unreadable, "whose header cannot be read (see verify)"),
        (scan.vanished, "removed by others meanwhile"),
    ]
    text = ", ".join(f"{count:,} {what}" for count, what in notes if count)
    return f"passed over: {text}\n" if text else ""


def _entries(count: int, kind: str = "") -> str:
    """``1 entry``, ``2 bad entries``, ..."""
    return f"{count:,} {kind}{'entry' if count == 1 else 'entries'}"


def _title(tier: dict[str, str]) -> str:
    return f"{tier['type']} tier {tier['name']!r} at {tier['location']}"
