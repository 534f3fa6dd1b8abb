"""kvmux under ``vllm serve``, as users run it: HTTP, the ``openai`` client, concurrency,
chat templates, a restart.

Three servers start, one after the other, on a tiny random-weight float32 Llama with a
tokenizer trained offline: one without connector (the reference), one with a MuxConnector
over a memory tier and a disk tier, and the same again after a restart (its memory tier
empty, its disk tier full). Every output equals the reference's, log-probabilities
within 1e-3, and the hits show in ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kvmux.testing.models import build_random_llama
from kvmux.testing.tokenizer import build_tokenizer
from tests.support.vllm_server import vllm_server

pytestmark = pytest.mark.vllm
openai = pytest.importorskip("openai")

BLOCK = 128
CONCURRENT = 16
LOGPROB_TOLERANCE = 1e-3
WORDS = [
    "def",
    "return",
    "class",
    "import",
    "while",
    "for",
    "yield",
    "lambda",
    "with",
    "assert",
    "value",
    "request",
    "block",
]


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


SHARED = text(1, 600)  # the prefix every concurrent prompt shares
LONG = text(2, 700)
SYSTEM = text(3, 500)


def _completion(client: Any, model: str, prompt: str) -> dict[str, Any]:
    reply = client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0, logprobs=1
    )
    choice = reply.choices[0]
    return {
        "text": choice.text,
        "logprobs": list(choice.logprobs.token_logprobs),
        "prompt_tokens": reply.usage.prompt_tokens,
        "cached": reply.usage.prompt_tokens_details.cached_tokens or 0,
    }


def _chat(client: Any, model: str) -> dict[str, Any]:
    reply = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "and then?"},
        ],
        max_tokens=8,
        temperature=0,
        logprobs=True,
    )
    choice = reply.choices[0]
    return {
        "text": choice.message.content,
        "logprobs": [t.logprob for t in choice.logprobs.content],
        "prompt_tokens": reply.usage.prompt_tokens,
        "cached": reply.usage.prompt_tokens_details.cached_tokens or 0,
    }


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s series on the server's /metrics with these label values."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def tier_series(url: str) -> dict[tuple[str, str, str], float]:
    """Every ``kvmux_tier_*_total`` series on /metrics: (name, child, tier) to its value."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    found: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("kvmux_tier_") and "_total{" in line:
            name, rest = line.split("{", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            key = (name, labels.get("child", ""), labels.get("tier", ""))
            found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def hit_metrics(url: str) -> dict[str, float]:
    """Cached prompt tokens by source (vLLM's split), and the mux's hits per child."""
    cached = "vllm:prompt_tokens_cached_by_source_total"
    return {
        "host": metric(url, cached, source="host"),
        "disk": metric(url, cached, source="disk"),
        "0:memory": metric(url, "kvmux_mux_hit_tokens_total", child="0:memory"),
        "1:disk": metric(url, "kvmux_mux_hit_tokens_total", child="1:disk"),
    }


def workload(url: str, model: str) -> dict[str, Any]:
    """A long completion, a chat, then 16 concurrent completions sharing a prefix."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    prompts = [f"{SHARED} {text(100 + i, 40)}" for i in range(CONCURRENT)]
    with ThreadPoolExecutor(CONCURRENT) as pool:
        concurrent = list(pool.map(lambda p: _completion(client, model, p), prompts))
    return {
        "completion": _completion(client, model, LONG),
        "chat": _chat(client, model),
        "concurrent": concurrent,
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The workload's results on each server, in order."""
    work = tmp_path_factory.mktemp("serve")
    model = build_tokenizer(build_random_llama(work / "model"), vocab_size=1024)
    tiers = [
        {"type": "memory", "capacity": "256MiB", "name": "memory"},
        {"type": "disk", "path": str(work / "disk"), "capacity": "1GiB", "name": "disk"},
    ]
    kv = {  # no kv_connector_module_path: kvmux's vLLM plugin registers the name
        "kv_connector": "MuxConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"tiers": tiers},
    }
    log = work / "servers.log"
    try:
        return _serve_all(model, kv, log)
    except Exception as exc:  # the servers' log holds the cause
        tail = log.read_text(errors="replace")[-6000:] if log.exists() else ""
        raise RuntimeError(f"{exc}\n--- servers' log (tail) ---\n{tail}") from exc


def _serve_all(model: Path, kv: dict[str, Any], log: Path) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    with vllm_server(model, log) as url:
        runs["reference"] = workload(url, str(model))
    with vllm_server(model, log, kv) as url:
        runs["cold"] = workload(url, str(model))
        runs["warm"] = workload(url, str(model))
        runs["warm"]["metrics"] = hit_metrics(url)
    with vllm_server(model, log, kv) as url:
        runs["restarted"] = workload(url, str(model))
        runs["restarted"]["metrics"] = hit_metrics(url)
        runs["restarted"]["tiers"] = tier_series(url)
        runs["bench"] = bench_serve(url, model)
    return runs


def bench_serve(url: str, model: Path) -> subprocess.CompletedProcess[str]:
    """``vllm bench serve`` of a few random prompts against the server at ``url``."""
    command = [str(Path(sys.executable).parent / "vllm"), "bench", "serve"]
    command += ["--base-url", url, "--model", str(model), "--dataset-name", "random"]
    command += ["--random-input-len", "256", "--random-output-len", "4", "--num-prompts", "4"]
    command += ["--disable-tqdm", "--seed", "0"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def same_output(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["text"] == want["text"]
    assert got["prompt_tokens"] == want["prompt_tokens"]
    worst = max(abs(a - b) for a, b in zip(got["logprobs"], want["logprobs"], strict=True))
    assert worst < LOGPROB_TOLERANCE


def full_blocks_below_last(result: dict[str, Any]) -> int:
    return (result["prompt_tokens"] - 1) // BLOCK * BLOCK


@pytest.mark.parametrize("run", ["cold", "warm", "restarted"])
def test_outputs_equal_a_server_without_connector(served: dict[str, Any], run: str) -> None:
    reference = served["reference"]
    for kind in ("completion", "chat"):
        same_output(served[run][kind], reference[kind])
    for got, want in zip(served[run]["concurrent"], reference["concurrent"], strict=True):
        same_output(got, want)


def test_nothing_is_cached_without_a_connector_or_on_a_cold_server(served: dict[str, Any]) -> None:
    for run in ("reference", "cold"):
        assert served[run]["completion"]["cached"] == 0
        assert served[run]["chat"]["cached"] == 0


def test_warm_hits_show_in_cached_tokens(served: dict[str, Any]) -> None:
    warm = served["warm"]
    for kind in ("completion", "chat"):
        assert warm[kind]["cached"] == full_blocks_below_last(warm[kind]) > 0
    for result in warm["concurrent"]:
        assert result["cached"] == full_blocks_below_last(result) > 0


def test_a_restarted_server_loads_from_disk(served: dict[str, Any]) -> None:
    restarted = served["restarted"]
    for kind in ("completion", "chat"):
        assert restarted[kind]["cached"] == full_blocks_below_last(restarted[kind]) > 0


def test_hits_are_split_by_tier_in_the_servers_metrics(served: dict[str, Any]) -> None:
    """vLLM's prompt_tokens_cached_by_source: memory hits as host, disk hits as disk; the
    mux's own counters per child agree."""
    warm, restarted = served["warm"]["metrics"], served["restarted"]["metrics"]
    assert warm["host"] > 0 and warm["disk"] == 0
    assert warm["0:memory"] == warm["host"]
    assert restarted["disk"] > 0 and restarted["1:disk"] == restarted["disk"]


def test_each_tier_exports_its_own_counters_zeros_included(served: dict[str, Any]) -> None:
    """Each StoreConnector child's ``kvmux_tier_*`` series, once, with its child label."""
    tiers = served["restarted"]["tiers"]
    assert tiers[("kvmux_tier_load_errors_total", "0:memory", "memory")] == 0
    assert tiers[("kvmux_tier_save_errors_total", "1:disk", "disk")] == 0
    assert tiers[("kvmux_tier_hit_tokens_total", "1:disk", "disk")] > 0
    assert {(child, tier) for _, child, tier in tiers} == {
        ("0:memory", "memory"),
        ("1:disk", "disk"),
    }


def test_vllm_bench_serve_runs_against_a_server_with_kvmux(served: dict[str, Any]) -> None:
    """``vllm bench serve`` works in the environment the README's setup creates."""
    bench = served["bench"]
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert re.search(r"Successful requests:\s+4\b", bench.stdout), bench.stdout[-3000:]
