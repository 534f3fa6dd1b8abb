"""The ``kvmux`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["main"]

DEFAULT_DIR = Path.home() / ".cache" / "kvmux"


def _demo(args: argparse.Namespace) -> int:
    from kvmux.tools.demo import format_table, run_demo

    print(
        f"kvmux demo: building the model and starting vLLM twice (workdir {args.dir})", flush=True
    )
    rows = run_demo(args.dir, prompt_tokens=args.prompt_tokens)
    print(format_table(rows))
    return 0


def _bench_tier(args: argparse.Namespace) -> int:
    import json

    from kvmux.config import parse_capacity
    from kvmux.tools.ops.main import tier_of
    from kvmux.tools.tier_bench import bench_tier, format_rows

    spec = tier_of(args)
    entry_bytes = parse_capacity(args.entry_size, "entry_size")
    if not args.json:
        print(f"kvmux bench tier: {args.entries} entries of {entry_bytes} bytes", flush=True)
    result = bench_tier(spec, args.entries, entry_bytes)
    print(json.dumps(result, indent=1) if args.json else format_rows(result["rows"]))
    return 0


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from kvmux.tools.ops.main import add_tier_options

    bench = commands.add_parser(  # the comparative studies: python -m benchmarks (not shipped)
        "bench",
        help="measure a tier against its device",
        description="Measure kvmux on your own deployment. The comparative studies (vLLM, "
        "its peers, charts) live in the repository: python -m benchmarks.",
    )
    kinds = bench.add_subparsers(dest="bench", required=True)
    text = "a disk or Redis tier's put and get beside plain writes and reads of the same bytes"
    tier = kinds.add_parser("tier", help=text, description=text)
    add_tier_options(tier)
    tier.add_argument("--entries", type=int, default=64, help="entries per pass (default 64)")
    tier.add_argument(
        "--entry-size", default="2MiB", help="bytes of one entry, as a block's KV (default 2MiB)"
    )
    tier.add_argument("--json", action="store_true", help="JSON on stdout")
    tier.set_defaults(func=_bench_tier)


def _check_config(args: argparse.Namespace) -> int:
    from kvmux.tools.check import check_config

    for line in check_config(args.config):
        print(line)
    print("config ok")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvmux", description="KV-cache tiers for vLLM.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="load a long prompt from memory, then from disk after a restart"
    )
    demo.add_argument("--dir", type=Path, default=DEFAULT_DIR / "demo", help="work directory")
    demo.add_argument("--prompt-tokens", type=int, default=3000, help="prompt length")
    demo.set_defaults(func=_demo)
    _add_bench(commands)
    check = commands.add_parser(
        "check-config", help="validate a --kv-transfer-config offline (no vLLM, no model)"
    )
    check.add_argument("config", help="the JSON given to vllm serve --kv-transfer-config")
    check.set_defaults(func=_check_config)
    from kvmux.tools.ops import add_parsers  # ls, stats, verify, purge: no vLLM, no torch

    add_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. kvmux ls | head: the reader is gone, stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # a clear line, not a traceback, for any failure
        from kvmux.errors import KvmuxError

        if not isinstance(exc, KvmuxError):
            raise
        print(f"kvmux: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
