"""StoreConnector's scheduler half on stand-in engine configs: counters per instance."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvmux.vllm import StoreConnector

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


def look_up(connector: StoreConnector, req_id: str, tokens: int) -> int | None:
    request = SimpleNamespace(
        request_id=req_id,
        prompt_token_ids=list(range(1, tokens + 1)),
        lora_request=None,
        cache_salt=None,
    )
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
