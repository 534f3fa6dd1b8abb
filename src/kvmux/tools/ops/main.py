"""The ``kvmux ls | stats | verify | purge`` subcommands: their arguments and their run."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

from kvmux.config import StoreSpec
from kvmux.errors import ConfigError
from kvmux.tools.ops import commands
from kvmux.tools.ops.progress import Progress
from kvmux.tools.ops.scan import Scan, Selection
from kvmux.tools.ops.tier import describe_tier, open_tier, tier_spec
from kvmux.tools.ops.units import parse_duration

__all__ = ["COMMANDS", "add_parsers", "add_tier_options", "run_command", "tier_of"]

COMMANDS = {
    "ls": "list entries: key, namespace, size, age, signing key",
    "stats": "entries, bytes and ages per namespace",
    "verify": "check every entry's checksum (and signature); report or remove bad ones",
    "purge": "remove entries: all, by namespace, or by age",
}


def add_tier_options(parser: argparse.ArgumentParser) -> None:
    """The options that name a tier (``tier_spec`` reads them)."""
    tier = parser.add_argument_group("tier (exactly one)")
    source = tier.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", metavar="JSON", help="a store spec as the config takes it")
    source.add_argument("--disk", metavar="PATH", help="a disk tier's directory")
    source.add_argument("--redis", metavar="URL", help="a Redis tier (key prefix kvmux:)")
    tier.add_argument("--cluster", action="store_true", help="with --redis: Redis Cluster")
    tier.add_argument("--signing-key-file", metavar="PATH", help="the tier's signing keys")
    tier.add_argument("--signing-key-env", metavar="VAR", help="the tier's signing keys")


def tier_of(args: argparse.Namespace) -> StoreSpec:
    """The spec of the tier the ``add_tier_options`` options name."""
    return tier_spec(
        args.store, args.disk, args.redis, args.cluster, args.signing_key_file, args.signing_key_env
    )


def _common() -> argparse.ArgumentParser:
    """Options every subcommand takes: the tier, the selection, the output."""
    common = argparse.ArgumentParser(add_help=False)
    add_tier_options(common)
    chosen = common.add_argument_group("selection (default: every entry)")
    chosen.add_argument(
        "--namespace", action="append", metavar="NS", help="namespace id or prefix (repeatable)"
    )
    chosen.add_argument(
        "--older-than", metavar="AGE", help="not written or loaded for AGE, e.g. 7d, 12h, 1d12h"
    )
    output = common.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="JSON on stdout")
    output.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    return common


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the four subcommands to the ``kvmux`` parser."""
    common = _common()
    parsers = {
        name: subparsers.add_parser(name, parents=[common], help=text, description=text)
        for name, text in COMMANDS.items()
    }
    parsers["ls"].add_argument("--limit", type=int, default=None, help="list at most N entries")
    parsers["stats"].add_argument(
        "--verify", action="store_true", help="also verify every entry and count bad ones"
    )
    parsers["verify"].add_argument("--delete", action="store_true", help="remove bad entries")
    parsers["verify"].add_argument(
        "--strict", action="store_true", help="unsigned or unknown-key entries are bad too"
    )
    parsers["purge"].add_argument("--all", action="store_true", help="every entry of the tier")
    parsers["purge"].add_argument(
        "--dry-run", action="store_true", help="report what would be removed; remove nothing"
    )
    for parser in parsers.values():
        parser.set_defaults(func=run_command)


def _selection(args: argparse.Namespace) -> Selection:
    older = parse_duration(args.older_than) if args.older_than else None
    selection = Selection(tuple(ns.lower() for ns in args.namespace or ()), older)
    if args.command == "purge" and selection.everything and not args.all:
        raise ConfigError("purge", "say what to remove", ("--all", "--namespace", "--older-than"))
    if args.command == "purge" and args.all and not selection.everything:
        raise ConfigError("--all", "removes every entry: give no --namespace or --older-than")
    if args.command == "ls" and args.limit is not None and args.limit < 0:
        raise ConfigError("--limit", f"expected a count, got {args.limit}")
    return selection


def run_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one subcommand on the tier its arguments name; returns the exit status."""
    out = out if out is not None else sys.stdout
    spec = tier_of(args)
    selection = _selection(args)
    with _quiet_store_logs():
        return _run(args, spec, selection, out)


@contextlib.contextmanager
def _quiet_store_logs() -> Iterator[None]:
    """The stores' warnings repeat what the command reports: keep them off stderr meanwhile."""
    logger = logging.getLogger("kvmux.stores")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run(args: argparse.Namespace, spec: StoreSpec, selection: Selection, out: TextIO) -> int:
    store = open_tier(spec)
    try:
        progress = Progress(args.command, enabled=False if args.quiet else None)
        verify = args.command == "verify" or (args.command == "stats" and args.verify)
        scan = Scan(store, selection, progress, verify, spec.signing)
        tier = describe_tier(spec)
        if args.command == "ls":
            return commands.ls(scan, out, args.json, args.limit)
        if args.command == "stats":
            return commands.stats(scan, out, args.json, tier)
        if args.command == "verify":
            return commands.verify(scan, out, args.json, tier, args.delete, args.strict)
        return commands.purge(scan, out, args.json, tier, args.dry_run)
    finally:
        store.close()
