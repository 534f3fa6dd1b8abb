"""Real vLLM configs and schedulers for connector unit tests, without an engine.

The counterpart of ``create_vllm_config`` and ``create_scheduler`` in vLLM's
``tests/v1/kv_connector/unit/utils.py``: the model is a local random-weight Llama (only its
``config.json`` is read), the device is the CPU, and the connector is MuxConnector unless
told otherwise.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

__all__ = ["create_scheduler", "create_vllm_config", "empty_kv_cache_config"]


def create_vllm_config(
    model: str,
    *,
    kv_connector: str = "MuxConnector",
    kv_connector_module_path: str | None = "kvmux.vllm",
    kv_connector_extra_config: dict[str, Any] | None = None,
    kv_role: Literal["kv_producer", "kv_both", "kv_consumer"] = "kv_both",
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail",
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 4096,
    disable_hybrid_kv_cache_manager: bool | None = None,
) -> VllmConfig:
    """A VllmConfig for the model directory ``model`` with one KV connector configured."""
    model_config = ModelConfig(model=model, dtype="float32", seed=42, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=model_config.is_encoder_decoder,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
    )
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=True,
    )
    kv_transfer_config = KVTransferConfig(
        kv_connector=kv_connector,
        kv_connector_module_path=kv_connector_module_path,
        kv_role=kv_role,
        kv_connector_extra_config=kv_connector_extra_config or {},
        kv_load_failure_policy=kv_load_failure_policy,
    )
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        kv_transfer_config=kv_transfer_config,
        device_config=DeviceConfig("cpu"),
    )


def empty_kv_cache_config() -> KVCacheConfig:
    """A KV cache config with no blocks and no groups, as connector-only tests use."""
    return KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[])


def create_scheduler(vllm_config: VllmConfig, num_blocks: int = 10000) -> Scheduler:
    """vLLM's scheduler over one full-attention group of ``num_blocks`` blocks.

    The scheduler builds the configured connector itself (SCHEDULER role).
    """
    block_size = vllm_config.cache_config.block_size
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
    )
