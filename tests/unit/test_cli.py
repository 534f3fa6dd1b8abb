"""The command line stands alone: ``kvmux --help`` loads no engine, no charts, no benchmarks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "vllm", "matplotlib", "tqdm", "benchmarks", "kvmux.testing")
PROBE = """
import contextlib, io, json, sys
from kvmux.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
heavy = json.loads({heavy!r})
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m in heavy)))
"""


@pytest.mark.parametrize(
    "argv", [["--help"], ["bench", "--help"], ["bench", "tier", "--help"], ["ls", "--help"]]
)
def test_help_imports_no_engine_charts_or_benchmarks(argv: list[str]) -> None:
    code = PROBE.format(heavy=json.dumps(HEAVY))
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(proc.stdout.splitlines()[-1]) == []
