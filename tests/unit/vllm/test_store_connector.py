"""StoreConnector's scheduler half on stand-in engine configs: counters, keys, namespace."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvmux.keys import namespace_id
from kvmux.vllm import StoreConnector
from kvmux.vllm.engine_config import checkpoint_identity, engine_namespace

BLOCK = 16


class Blocks:
    """A KVCacheBlocks stand-in with one group."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self.ids),)


def _engine(store: dict[str, Any]) -> tuple[SimpleNamespace, SimpleNamespace]:
    ktc = KVTransferConfig(
        kv_connector="StoreConnector",
        kv_connector_module_path="kvmux.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"store": store},
    )
    vllm_config = SimpleNamespace(
        kv_transfer_config=ktc,
        model_config=SimpleNamespace(
            model="unit-model", revision=None, hf_config=SimpleNamespace(), dtype="float32"
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(cache_dtype="auto"),
    )
    spec = SimpleNamespace(
        block_size=BLOCK, page_size_bytes=4096, dtype="float32", num_kv_heads=2, head_size=8
    )
    group = SimpleNamespace(kv_cache_spec=spec, layer_names=["layer.0", "layer.1"])
    return vllm_config, SimpleNamespace(kv_cache_groups=[group], num_blocks=64)


def scheduler(store: dict[str, Any]) -> StoreConnector:
    vllm_config, kv_cache_config = _engine(store)
    return StoreConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)  # type: ignore[arg-type]


def fake_request(req_id: str, tokens: int, **fields: Any) -> SimpleNamespace:
    """The fields of a vLLM Request that kvmux reads; ``fields`` override them."""
    request = SimpleNamespace(
        request_id=req_id,
        prompt_token_ids=list(range(1, tokens + 1)),
        num_prompt_tokens=tokens,
        lora_request=None,
        cache_salt=None,
        mm_features=[],
        prompt_embeds=None,
        _prompt_embeds_per_block_hashes={},
    )
    request.__dict__.update(fields)
    return request


def look_up(connector: StoreConnector, req_id: str, tokens: int, **fields: Any) -> int | None:
    request = fake_request(req_id, tokens, **fields)
    hit, _ = connector.get_num_new_matched_tokens(request, 0)  # type: ignore[arg-type]
    connector.update_state_after_alloc(request, Blocks(list(range(1, 9))), hit or 0)  # type: ignore[arg-type]
    return hit


MEMORY = {"type": "memory", "capacity": "1MiB"}  # both tiers take the default name "memory"


def test_two_tiers_of_one_name_keep_their_own_counters() -> None:
    one, other = scheduler(MEMORY), scheduler(MEMORY)
    assert one.tier_name == other.tier_name == "memory"
    look_up(one, "a", 5 * BLOCK)
    look_up(one, "b", 5 * BLOCK)
    assert one.stats.snapshot()["lookups"] == 2
    assert other.stats.snapshot()["lookups"] == 0


def test_the_scheduler_half_reports_its_own_counters_once() -> None:
    connector = scheduler(MEMORY)
    assert connector.get_kv_connector_stats() is None
    look_up(connector, "a", 5 * BLOCK)
    stats = connector.get_kv_connector_stats()
    assert stats is not None
    assert stats.reduce()["lookups"] == 1
    assert stats.reduce()["hit_tokens"] == 0
    assert connector.get_kv_connector_stats() is None  # nothing new since
    connector.shutdown()


def test_a_request_kvmux_cannot_key_is_neither_loaded_nor_saved() -> None:
    connector = scheduler(MEMORY)
    odd = {
        "mm_features": [
            SimpleNamespace(identifier=1.5, mm_position=SimpleNamespace(offset=0, length=4))
        ]
    }
    assert look_up(connector, "odd", 3 * BLOCK, **odd) == 0
    assert connector.stats.snapshot()["unkeyable_requests"] == 1
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="odd", num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={"odd": 3 * BLOCK},
        kv_connector_block_state=SimpleNamespace(get_block_ids=lambda _: ([1, 2, 3],)),
    )
    meta = connector.build_connector_meta(output)  # type: ignore[arg-type]
    assert meta.plan.saves == []  # type: ignore[attr-defined]


def test_checkpoint_identity_follows_the_weight_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 10)
    first = checkpoint_identity(str(tmp_path), None)
    assert checkpoint_identity(str(tmp_path), None) == first
    (tmp_path / "notes.txt").write_text("not weights")
    assert checkpoint_identity(str(tmp_path), None) == first
    weights.write_bytes(b"b" * 11)  # weights rewritten in place
    assert checkpoint_identity(str(tmp_path), None) != first
    assert checkpoint_identity("org/model", "abc123") == "revision:abc123"


def test_quantization_and_checkpoint_are_in_the_namespace(tmp_path: Path) -> None:
    vllm_config, kv_cache_config = _engine(MEMORY)
    base = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    vllm_config.model_config.quantization = "fp8"
    quantized = engine_namespace(vllm_config, kv_cache_config)  # type: ignore[arg-type]
    assert base["quantization"] == "None" and quantized["quantization"] == "fp8"
    assert namespace_id(base) != namespace_id(quantized)
    assert base["checkpoint"] == "revision:None"
