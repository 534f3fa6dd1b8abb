"""``python -m benchmarks``: the comparative run (every workload, the report, the bars)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.allocator import ALLOCATORS
from benchmarks.configs import CONFIGS
from benchmarks.host_memory import DISK_WRITES
from kvmux.errors import ConfigError, KvmuxError

DEFAULT_WORKDIR = Path.home() / ".cache" / "kvmux" / "bench"


def parser() -> argparse.ArgumentParser:
    """The run's options."""
    bench = argparse.ArgumentParser(
        prog="python -m benchmarks", description="kvmux against its peers and the physical limits"
    )
    bench.add_argument("--quick", action="store_true", help="the small run (a tiny model, minutes)")
    bench.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder")
    bench.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="models and tiers")
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
    return bench


def bench(args: argparse.Namespace) -> int:
    """Run the benchmark; print the bars and where the results are."""
    from benchmarks.bars import format_bars
    from benchmarks.run import run_bench

    configs = tuple(args.configs.split(",")) if args.configs else CONFIGS
    unknown = set(configs) - set(CONFIGS)
    if unknown:
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


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; a kvmux error is one line, not a traceback."""
    args = parser().parse_args(argv)
    try:
        return bench(args)
    except KeyboardInterrupt:
        return 130
    except KvmuxError as exc:
        print(f"python -m benchmarks: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
