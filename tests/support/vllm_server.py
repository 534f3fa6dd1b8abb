"""A real ``vllm serve`` process for the tests, started and stopped by them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.redis_server import free_port

START_SECONDS = 600  # vllm serve on 2 busy cores takes 1 to 3 minutes to come up


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


@contextmanager
def vllm_server(
    model: Path, log: Path, kv: dict[str, Any] | None = None, *extra: str
) -> Iterator[str]:
    """``vllm serve`` on a free port (float32, prompt-token details on); yields its URL."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "vllm"),
        "serve",
        str(model),
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "16",
        "--enable-prompt-tokens-details",
        "--no-enable-prefix-caching",  # every hit comes from the connector
        *extra,
    ]
    if kv is not None:
        command += ["--kv-transfer-config", json.dumps(kv)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"vllm serve did not come up (exit {proc.poll()}):\n{tail}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
