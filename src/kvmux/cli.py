"""The ``kvmux`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]

DEFAULT_DIR = Path.home() / ".cache" / "kvmux"


def _demo(args: argparse.Namespace) -> int:
    from kvmux.demo import format_table, run_demo

    print(
        f"kvmux demo: building the model and starting vLLM twice (workdir {args.dir})", flush=True
    )
    rows = run_demo(args.dir, prompt_tokens=args.prompt_tokens)
    print(format_table(rows))
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a clear line, not a traceback, for any failure
        from kvmux.errors import KvmuxError

        if not isinstance(exc, KvmuxError):
            raise
        print(f"kvmux: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
