"""Operators' tools for disk and Redis tiers: ``kvmux ls | stats | verify | purge``.

A tier is named as a config names it (``--store JSON``, or ``--disk PATH`` / ``--redis
URL``). Entries are walked through the stores (``KVStore.walk``), their headers read from
their first bytes, and with ``verify`` each whole entry is checked by ``kvmux.codec``
as every load checks it. Nothing here imports vLLM or torch.
"""

from kvmux.tools.ops.commands import EXIT_BAD, EXIT_FAILED, ls, purge, stats, verify
from kvmux.tools.ops.entry import Header, check, peek
from kvmux.tools.ops.main import add_parsers, run_command
from kvmux.tools.ops.progress import Progress
from kvmux.tools.ops.scan import Record, Scan, Selection
from kvmux.tools.ops.tier import describe_tier, open_tier, tier_spec
from kvmux.tools.ops.units import format_age, format_size, parse_duration

__all__ = [
    "EXIT_BAD",
    "EXIT_FAILED",
    "Header",
    "Progress",
    "Record",
    "Scan",
    "Selection",
    "add_parsers",
    "check",
    "describe_tier",
    "format_age",
    "format_size",
    "ls",
    "open_tier",
    "parse_duration",
    "peek",
    "purge",
    "run_command",
    "stats",
    "tier_spec",
    "verify",
]
