"""kvmux against its peers and the raw limits of the hardware and services it runs on.

Not part of the kvmux wheel: run from the repository root, ``python -m benchmarks
[--quick]`` (``bash scripts/bench.sh`` installs what it needs first; see
benchmarks/README.md). The harness it shares with the tests and the demo is
``kvmux.testing``; a tier's own put and get against its device is ``kvmux bench tier``.
"""
