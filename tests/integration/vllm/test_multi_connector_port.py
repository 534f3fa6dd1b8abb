"""vLLM's engine-level MultiConnector tests, ported to MuxConnector in real vLLM engines.

Ports of the tests of vLLM's ``tests/v1/kv_connector/unit/test_multi_connector.py`` that
start ``vllm.LLM`` (the others are in tests/unit/vllm/test_multi_connector_port.py). Each
engine runs a tiny random-weight float32 Llama in its own process; two engine starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BASE_ENGINE, ENGINE_ENV, make_prompt
from tests.support import mock_connectors
from tests.support.connector_engine import run_connector_job
from tests.support.recording_connector import MODULE as RECORDING_MODULE
from tests.support.recording_connector import from_new_request, without_polling

pytestmark = pytest.mark.vllm

BLOCK = 128
CONTEXT = make_prompt(31, 650)
PROMPTS = [make_prompt(32, 700, prefix=CONTEXT), make_prompt(33, 700, prefix=CONTEXT)]
NUM_BLOCKS = -(-len(PROMPTS[0]) // BLOCK)  # blocks the prompt is allocated
HIT = (len(PROMPTS[0]) - 1) // BLOCK * BLOCK  # ExampleConnector: whole blocks below the last token
# one chunk holds a whole prompt: ExampleConnector fails on a prompt split by chunked prefill
ENGINE = {**BASE_ENGINE, "block_size": BLOCK, "max_num_batched_tokens": 1024}


def mux(*children: dict[str, Any]) -> dict[str, Any]:
    """KVTransferConfig fields of a MuxConnector over ``children`` (default policy)."""
    return {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": list(children)},
    }


def recording(name: str, root: Path) -> dict[str, Any]:
    """A RecordingExampleConnector child storing under ``root/name``."""
    return {
        "kv_connector": "RecordingExampleConnector",
        "kv_connector_module_path": RECORDING_MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "shared_storage_path": str(root / name),
            "name": name,
            "events_dir": str(root / "events"),
        },
    }


def generate(prompt: list[int]) -> dict[str, Any]:
    return {"op": "generate", "prompts": [prompt], "max_tokens": 4}


def scheduler_events(step: dict[str, Any], name: str) -> list[str]:
    """One child's scheduler-side events of a step, from its request's arrival on."""
    return from_new_request(without_polling(step["events"][f"{name}-SCHEDULER"]))


def test_multi_example_connector_consistency(tiny_model: str, tmp_path: Path) -> None:
    """Port of test_multi_example_connector_consistency: two ExampleConnector children save
    identical KV; the first child with a hit loads, the other is told 0 external tokens;
    once the first child's storage is gone, the second one loads.

    vLLM 0.32 binds the block pool through bind_kv_cache_manager (vLLM main calls
    bind_gpu_block_pool), calls get_finished_count and get_mem_pool_context at start, and
    on the CPU backend calls start_load_kv after the layers on a step without loads: the
    expected sequences are those the children of vLLM 0.32's MultiConnector see in this
    same job.
    """
    storage1, storage2, events = tmp_path / "storage1", tmp_path / "storage2", tmp_path / "events"
    read = {"op": "events", "dir": str(events)}
    steps = [
        generate(PROMPTS[0]),
        {"op": "digest", "path": str(storage1)},
        {"op": "digest", "path": str(storage2)},
        read,
        {"op": "reset_prefix_cache"},  # or the engine's own prefix cache answers
        generate(PROMPTS[1]),
        read,
        {"op": "rmtree", "path": str(storage1)},
        {"op": "reset_prefix_cache"},
        generate(PROMPTS[0]),
        read,
    ]
    job = {
        "model": tiny_model,
        "engine": ENGINE,
        "kv": mux(recording("storage1", tmp_path), recording("storage2", tmp_path)),
        "steps": steps,
    }
    cold, files1, files2, cold_events, _, warm, warm_events, _, _, again, again_events = (
        run_connector_job(job, env=ENGINE_ENV)["steps"]
    )

    # both children saved the same entries, byte for byte
    assert files1["files"], "storage1 is empty after generation"
    assert files1["files"] == files2["files"]

    for name in ("storage1", "storage2"):
        assert without_polling(cold_events["events"][f"{name}-SCHEDULER"])[:7] == [
            "bind_kv_cache_manager",
            "get_finished_count",
            "set_xfer_handshake_metadata_pp_aware",
            "on_new_request",
            "get_num_new_matched_tokens 0",
            f"update_state_after_alloc num_blocks=[{NUM_BLOCKS}] 0",
            "build_connector_meta",
        ]
        assert cold_events["events"][f"{name}-WORKER"][:8] == [
            "get_mem_pool_context",
            "register_kv_caches",
            "set_host_xfer_buffer_ops",
            "get_handshake_metadata",
            "handle_preemptions",
            "bind_connector_metadata",
            "wait_for_layer_load",
            "save_kv_layer",
        ]

    # the first child with a hit loads; the other gets the request's blocks and 0 tokens
    assert warm["num_cached_tokens"] == [HIT]
    for name, tokens in (("storage1", HIT), ("storage2", 0)):
        assert scheduler_events(warm_events, name)[:4] == [
            "on_new_request",
            "get_num_new_matched_tokens 0",
            f"update_state_after_alloc num_blocks=[{NUM_BLOCKS}] {tokens}",
            "build_connector_meta",
        ]

    # storage1 is gone: it offers nothing, and storage2 loads
    assert again["num_cached_tokens"] == [HIT]
    assert again["tokens"] == cold["tokens"]
    for name, tokens in (("storage1", 0), ("storage2", HIT)):
        assert scheduler_events(again_events, name)[:4] == [
            "on_new_request",
            "get_num_new_matched_tokens 0",
            f"update_state_after_alloc num_blocks=[{NUM_BLOCKS}] {tokens}",
            "build_connector_meta",
        ]


def test_multi_connector_mixed_hma_disables_hybrid_kv_cache(tiny_model: str) -> None:
    """Port of test_multi_connector_mixed_hma_disables_hybrid_kv_cache (GPU-only in vLLM,
    with NixlConnector), translated: MuxConnector supports HMA at class level, so vLLM
    keeps its hybrid KV cache manager on; over a one-group model an HMA child and a
    non-HMA child then run side by side. (A model with several groups is refused at
    start over that mix: see the unit port of test_multi_connector_hma_support_detection
    and tests/integration/vllm/test_hybrid.py.)"""
    quiet = {"kv_role": "kv_both", "kv_connector_module_path": mock_connectors.MODULE}
    kv = mux(
        {"kv_connector": "QuietHMAConnector", **quiet},
        {"kv_connector": "QuietConnector", **quiet},
    )
    job = {"model": tiny_model, "engine": BASE_ENGINE, "kv": kv, "steps": [{"op": "inspect"}]}
    (found,) = run_connector_job(job, env=ENGINE_ENV)["steps"]
    assert found["disable_hybrid_kv_cache_manager"] is False
    assert found["connector"] == "MuxConnector"
    assert found["children_support_hma"] == [True, False]
    assert found["config_supports_hma"] is True
