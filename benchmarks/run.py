"""Run the kvmux benchmark: the same as ``kvmux bench`` (see benchmarks/README.md)."""

from __future__ import annotations

import sys

from kvmux.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
