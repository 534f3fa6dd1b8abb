"""Start a scripted vLLM engine in a child process and collect its JSON result."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvmux.errors import KvmuxError
from kvmux.testing.runner import RESULT_MARK

__all__ = ["EngineRunError", "run_engine_job"]


_ERROR_LINE = re.compile(r"^(\[rank\d+\]: )?[A-Za-z_.]*(Error|Exception)\b.*")


class EngineRunError(KvmuxError):
    """A scripted engine process failed."""


def run_engine_job(
    job: dict[str, Any],
    env: dict[str, str] | None = None,
    timeout: float = 900,
    python: str | None = None,
    module: str = "kvmux.testing.runner",
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Run ``job`` (see ``kvmux.testing.runner``) in a fresh process; return its result.

    ``module`` is the script run with ``python -m``: any that prints its result after
    ``RESULT_MARK`` on a line of its own.
    """
    with tempfile.TemporaryDirectory(prefix="kvmux-job-") as tmp:
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps(job))
        layout = "1" if job.get("multiprocess") else "0"  # vLLM's default layout is "1"
        child_env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": layout, **(env or {})}
        proc = subprocess.run(
            [python or sys.executable, "-m", module, str(job_file)],
            capture_output=True,
            text=True,
            env=child_env,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            result: dict[str, Any] = json.loads(line[len(RESULT_MARK) :])
            result["log"] = proc.stderr[-20000:]
            return result
    cause = next(
        (line for line in reversed(proc.stderr.splitlines()) if _ERROR_LINE.match(line)), ""
    )
    tail = f"{proc.stderr[-6000:]}\n{proc.stdout[-2000:]}"
    raise EngineRunError(f"engine job exited with {proc.returncode}: {cause}\n{tail}")
