"""The ``kvmux`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvmux.tools.bench.allocator import ALLOCATORS  # light: no vLLM, no torch
from kvmux.tools.bench.host_memory import DISK_WRITES  # light too

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


def _bench(args: argparse.Namespace) -> int:
    from kvmux.tools.bench.bars import format_bars
    from kvmux.tools.bench.configs import CONFIGS
    from kvmux.tools.bench.run import run_bench

    configs = tuple(args.configs.split(",")) if args.configs else CONFIGS
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        from kvmux.errors import ConfigError

        raise ConfigError("--configs", f"unknown {sorted(unknown)}", CONFIGS)
    lmcache = args.lmcache_python or Path(
        os.environ.get("KVMUX_LMCACHE_PYTHON", ".venv-lmcache/bin/python")
    )
    results = run_bench(
        args.out,
        args.quick,
        args.workdir,
        lmcache,
        configs,
        allocator=args.allocator,
        empty_redis=args.empty_redis,
        disk_writes=args.disk_writes,
    )
    print(format_bars(results["bars"]))
    print(f"results in {args.out} ({results['seconds']:.0f} s)")
    return 0


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
    bench = commands.add_parser("bench", help="kvmux against its peers and the physical limits")
    bench.add_argument("--quick", action="store_true", help="the small run (a tiny model, minutes)")
    bench.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder")
    bench.add_argument(
        "--workdir", type=Path, default=DEFAULT_DIR / "bench", help="models and tiers"
    )
    bench.add_argument(
        "--lmcache-python", type=Path, default=None, help="python of the LMCache venv"
    )
    bench.add_argument("--configs", default="", help="comma-separated subset of configurations")
    bench.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default="auto",
        help="every engine's memory allocator (auto: TCMalloc if installed, as vLLM asks on CPUs)",
    )
    bench.add_argument(
        "--empty-redis",
        action="store_true",
        help="start the Redis tier empty (a cold start) instead of full and evicting, "
        "as a cache that has been serving",
    )
    bench.add_argument(
        "--disk-writes",
        choices=DISK_WRITES,
        default="page-cache",
        help="how the disk tiers write: through the page cache, or around it "
        "(direct_writes; README, Disk tier)",
    )
    bench.set_defaults(func=_bench)
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
