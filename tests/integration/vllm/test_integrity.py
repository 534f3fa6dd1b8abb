"""Integrity in real vLLM: nothing computed over a failed load is ever stored or served.

The oracle is stronger than equal greedy tokens: stored KV is compared with the entries of
a clean run, and the log-probabilities of generated tokens with a run without connector
(float32: exact loads move them by about 1e-6, one wrong block by far more).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvmux import codec
from kvmux.tier.scheduler.generation import decode_record
from tests.integration.conftest import generate, make_prompt, results, store_kv

pytestmark = pytest.mark.vllm
torch = pytest.importorskip("torch")

BLOCK = 128  # the CPU backend's block size
LONG = make_prompt(40, 13 * BLOCK + 1)  # 13 full blocks below its last token
HEAD = LONG[: 10 * BLOCK + 1]  # its first 10 full blocks
MUXED = make_prompt(41, 9 * BLOCK + 1)
KV_TOLERANCE = 1e-3  # recomputed KV differs from a clean run by float rounding only
LOGPROB_TOLERANCE = 1e-3

Run = Callable[..., dict[str, Any]]


def disk(path: Path) -> dict[str, Any]:
    return {"type": "disk", "path": str(path), "capacity": "256MiB"}


def entries(folder: Path) -> dict[str, Any]:
    """Every entry of a disk tier, by file name, as one float tensor of its payload."""
    found = {}
    for path in folder.glob("??/*.kvx"):
        data = path.read_bytes()
        header_len = int.from_bytes(data[8:12], "little")
        header = json.loads(data[12 : 12 + header_len])
        entry = codec.decode(data, bytes.fromhex(header["ns"]), bytes.fromhex(header["key"]))
        found[path.name] = torch.frombuffer(bytearray(entry.payload), dtype=torch.float32)
    return found


@pytest.fixture(scope="module")
def reference(run_job: Run) -> dict[str, Any]:
    """Tokens and log-probabilities without any connector."""
    run = run_job([generate(LONG, MUXED, logprobs=True)], enable_prefix_caching=False)
    return results(run)[0]


def assert_same_logprobs(step: dict[str, Any], reference: dict[str, Any], index: int) -> None:
    assert step["tokens"][0] == reference["tokens"][index]
    got, want = step["logprobs"][0], reference["logprobs"][index]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def clean_entries(run_job: Run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The entries a clean run stores for LONG, and its tier's generation record (a tier
    that starts from it keys blocks as this one did: entries compare by file name)."""
    clean = tmp_path_factory.mktemp("clean-disk")
    run_job([generate(LONG)], kv=store_kv(disk(clean)), enable_prefix_caching=False)
    return {"entries": entries(clean), "generation": (clean / "generation").read_bytes()}


@pytest.mark.parametrize("layout", ["in-process", "multi-process"])
def test_blocks_computed_over_a_failed_load_are_not_stored(
    run_job: Run,
    tmp_path: Path,
    reference: dict[str, Any],
    clean_entries: dict[str, Any],
    layout: str,
) -> None:
    """A corrupt entry among 10 loaded blocks: the 3 blocks computed after them are not
    stored over it, and every block is stored exactly as a clean run stores it. Also in
    vLLM's default layout, with the engine core in a process of its own."""
    dirty = tmp_path / "dirty"
    dirty.mkdir()
    (dirty / "generation").write_bytes(clean_entries["generation"])
    steps = [
        generate(HEAD),
        {"op": "corrupt", "path": str(dirty), "count": 1},
        generate(LONG, logprobs=True),
        generate(LONG, logprobs=True),  # now served from the tier
    ]
    multiprocess = layout == "multi-process"
    # synchronous loads: the forward pass that follows a failed load computes over it (an
    # asynchronous load never does: its request waits, then runs from the failed block)
    kv = store_kv({**disk(dirty), "async_loads": "never"})
    run = run_job(steps, kv=kv, multiprocess=multiprocess, enable_prefix_caching=False)
    _, failing, served = results(run)
    if not multiprocess:  # the counters live in the engine core's process
        assert run["stats"]["disk"]["load_errors"] >= 1
        assert run["stats"]["disk"]["tainted_saves"] >= 1
    assert results(run, "corrupt")[0]["corrupted"]
    assert served["num_cached_tokens"] == [13 * BLOCK]
    assert_same_logprobs(failing, reference, 0)
    assert_same_logprobs(served, reference, 0)
    want, got = clean_entries["entries"], entries(dirty)
    assert len(want) == 13
    assert set(got) == set(want)  # the corrupt block was stored again once recomputed
    worst = max(float((got[name] - want[name]).abs().max()) for name in want)
    print(f"stored KV vs a clean run: max |diff| {worst:.2e} over {len(want)} blocks")
    assert worst < KV_TOLERANCE


@pytest.mark.parametrize("layout", ["in-process", "multi-process"])
def test_a_sibling_never_stores_what_another_child_failed_to_load(
    run_job: Run, tmp_path: Path, reference: dict[str, Any], layout: str
) -> None:
    """The disk child fails one block of its hit; the memory child must not keep those
    blocks (never loaded, or computed over one that was not) and serve them next time."""
    folder = tmp_path / "shared-disk"
    memory = {"type": "memory", "capacity": "64MiB", "name": "memory"}
    kv = {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"policy": "first", "tiers": [memory, disk(folder)]},
    }
    run_job([generate(MUXED)], kv=kv, enable_prefix_caching=False)  # fills the disk tier
    steps = [
        {"op": "corrupt", "path": str(folder), "count": 1},
        generate(MUXED, logprobs=True),  # memory empty: the disk child loads, one block fails
        generate(MUXED, logprobs=True),  # served from the memory child
    ]
    multiprocess = layout == "multi-process"
    run = run_job(steps, kv=kv, multiprocess=multiprocess, enable_prefix_caching=False)
    failing, served = results(run)
    assert served["num_cached_tokens"] == [9 * BLOCK]
    if not multiprocess:  # the counters live in the engine core's process
        assert run["stats"]["disk"]["load_errors"] >= 1
        assert run["stats"]["memory"]["hit_tokens"] == 9 * BLOCK
    assert_same_logprobs(failing, reference, 1)
    assert_same_logprobs(served, reference, 1)


def test_prompt_embeddings_are_keyed_by_their_contents(run_job: Run) -> None:
    """Two embedding prompts of one length share no key; the same one is served exactly."""
    first = {"embeds_seed": 1, "length": 5 * BLOCK + 1, "hidden": 128}
    second = {"embeds_seed": 2, "length": 5 * BLOCK + 1, "hidden": 128}
    steps = [
        generate(first, logprobs=True),
        generate(second, logprobs=True),
        generate(first, logprobs=True),
    ]
    store = {"type": "memory", "capacity": "64MiB"}
    run = run_job(steps, kv=store_kv(store), enable_prefix_caching=False, enable_prompt_embeds=True)
    cold, other, warm = results(run)
    assert cold["num_cached_tokens"] == [0]
    assert other["num_cached_tokens"] == [0]  # same length, same placeholder ids: no hit
    assert warm["num_cached_tokens"] == [5 * BLOCK]
    assert warm["tokens"] == cold["tokens"]
    worst = max(abs(a - b) for a, b in zip(warm["logprobs"][0], cold["logprobs"][0], strict=True))
    assert worst < LOGPROB_TOLERANCE


def test_a_connector_reset_serves_nothing_stored_before_it(
    run_job: Run, tmp_path: Path, reference: dict[str, Any]
) -> None:
    """reset_prefix_cache(reset_connector=True), as after a weight update: the disk tier,
    shared and persistent, serves nothing from before, to this engine or the next one."""
    folder = tmp_path / "reset-disk"
    steps = [
        generate(MUXED),
        generate(MUXED),
        {"op": "reset_prefix_cache", "reset_connector": True},
        generate(MUXED, logprobs=True),
        generate(MUXED, logprobs=True),
    ]
    run = run_job(steps, kv=store_kv(disk(folder)), enable_prefix_caching=False)
    assert results(run, "reset_prefix_cache")[0]["ok"] is True
    _, warm, after_reset, again = results(run)
    assert warm["num_cached_tokens"] == [9 * BLOCK]
    assert after_reset["num_cached_tokens"] == [0]  # nothing from before the reset
    assert again["num_cached_tokens"] == [9 * BLOCK]  # what was stored after it
    assert_same_logprobs(again, reference, 1)
    restarted = run_job([generate(MUXED)], kv=store_kv(disk(folder)), enable_prefix_caching=False)
    assert results(restarted)[0]["num_cached_tokens"] == [9 * BLOCK]
    assert decode_record((folder / "generation").read_bytes(), None) is not None


def test_signed_entries_load_only_for_holders_of_the_key(
    run_job: Run, tmp_path: Path, reference: dict[str, Any]
) -> None:
    """A writer without the key (here: another secret) cannot get an entry loaded."""
    folder = tmp_path / "signed-disk"
    ours, theirs = tmp_path / "ours.keys", tmp_path / "theirs.keys"
    ours.write_text("k1:" + "5a" * 32 + "\n")
    theirs.write_text("k1:" + "a5" * 32 + "\n")

    def signed(keys: Path) -> dict[str, Any]:
        return store_kv({**disk(folder), "signing": {"key_file": str(keys)}})

    settle = {"op": "sleep", "seconds": 1.0}  # the writer thread stores the entries
    forger = run_job([generate(MUXED), settle], kv=signed(theirs), enable_prefix_caching=False)
    assert forger["stats"]["disk"]["saved_blocks"] == 9
    steps = [
        generate(MUXED, logprobs=True),
        settle,  # its own entries replace the forger's
        generate(MUXED, logprobs=True),
    ]
    run = run_job(steps, kv=signed(ours), enable_prefix_caching=False)
    first, second = results(run)
    stats = run["stats"]["disk"]
    # the forger's generation record does not verify either: the engine moves to a new
    # generation, so it never even asks for the forger's entries (misses all the same)
    assert stats["unverified_entries"] == 0
    # its own signed entries, stored when it computed the blocks, load the next time
    assert second["num_cached_tokens"] == [9 * BLOCK]
    assert stats["loaded_blocks"] == 9
    assert_same_logprobs(first, reference, 1)
    assert_same_logprobs(second, reference, 1)


MM_BEFORE = " ".join(f"step {i}: read the request and return the config." for i in range(16))
MM_AFTER = " ".join(f"then check item {i} of the output list." for i in range(22))
MM_PROMPT = f"{MM_BEFORE}<image>{MM_AFTER}"  # about 240 + 259 image + 305 tokens


@pytest.fixture(scope="session")
def tiny_idefics3(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A float32 random Idefics3 (vision tower + 2-layer Llama), built once per session."""
    from tests.integration.multimodal_model import build_tiny_idefics3

    return str(build_tiny_idefics3(tmp_path_factory.mktemp("mm-model") / "tiny-idefics3"))


@pytest.mark.vllm
def test_images_are_keyed_by_their_contents(tiny_idefics3: str) -> None:
    """Two images of one size under the same prompt text (the same placeholder ids):
    the second gets no block that holds image placeholders, nor any after them; the
    first image again is served from the store and generates the same tokens."""
    from tests.integration.conftest import ENGINE_ENV
    from tests.integration.multimodal_model import run_multimodal_job

    steps = [{"prompt": MM_PROMPT, "image_seed": seed, "max_tokens": 8} for seed in (1, 2, 1)]
    engine = {
        "dtype": "float32",
        "enable_prefix_caching": False,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 4,
    }
    store = {"type": "memory", "capacity": "256MiB"}
    job = {"model": tiny_idefics3, "engine": engine, "kv": store_kv(store), "steps": steps}
    cold, other, warm = run_multimodal_job(job, env=ENGINE_ENV)["steps"]
    ids = cold["prompt_token_ids"]
    assert other["prompt_token_ids"] == ids == warm["prompt_token_ids"]
    start, end = cold["image_span"]
    full = (len(ids) - 1) // BLOCK * BLOCK  # tokens in full blocks below the last one
    assert start >= BLOCK and full >= end + BLOCK  # text-only blocks before and after it
    assert cold["num_cached_tokens"] == 0
    assert other["num_cached_tokens"] <= start // BLOCK * BLOCK
    assert other["num_cached_tokens"] == start // BLOCK * BLOCK  # the text before is shared
    assert warm["num_cached_tokens"] == full
    worst_other = max(abs(a - b) for a, b in zip(other["logprobs"], cold["logprobs"], strict=True))
    assert worst_other > LOGPROB_TOLERANCE  # the model does see the image
    assert warm["tokens"] == cold["tokens"]
    worst = max(abs(a - b) for a, b in zip(warm["logprobs"], cold["logprobs"], strict=True))
    assert worst < LOGPROB_TOLERANCE
