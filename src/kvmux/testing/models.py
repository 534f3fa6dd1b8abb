"""Random-weight Llama models built locally, for tests, the demo and benchmarks."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["MODEL_SIZES", "ModelSize", "build_random_hybrid", "build_random_llama"]


@dataclass(frozen=True)
class ModelSize:
    """Shape of a random Llama."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int | None = None  # None: hidden_size / num_attention_heads


MODEL_SIZES = {
    # one KV head of 64 (a block's bytes as 2 heads of 32): one entry per block
    # (kvmux.tier.shards), which the tests count, and the tier sizes the tests chose
    "tiny": ModelSize(2, 128, 4, 1, 256, 1024, 8192, head_dim=64),
    "tiny-gqa": ModelSize(2, 128, 4, 2, 256, 1024, 8192),  # 2 KV heads: one per TP=2 rank
    "demo": ModelSize(4, 512, 8, 4, 1408, 8192, 8192),
    "bench": ModelSize(8, 1024, 8, 4, 2816, 32000, 16384),
    "llama-1b": ModelSize(16, 2048, 32, 8, 8192, 128256, 32768),  # Llama 3.2 1B's shape
    # Llama 3.1 8B's KV bytes per token (32 layers x 8 KV heads of 128: 256 KiB in fp32)
    # in 4 layers x 64 KV heads of 128, at a fraction of its weights
    "llama-8b-kv": ModelSize(4, 512, 64, 64, 1024, 1024, 8192, head_dim=128),
}


def build_random_llama(
    path: Path, size: str = "tiny", dtype: str = "float32", seed: int = 0
) -> Path:
    """Build (once) a random-weight Llama at ``path``; returns the model directory."""
    return _build(path, size, dtype, seed, {})


def build_random_hybrid(
    path: Path, size: str = "tiny", dtype: str = "float32", seed: int = 0, window: int = 256
) -> Path:
    """Build (once) a random-weight Llama whose layers alternate sliding-window and full
    attention (``window`` tokens); vLLM's hybrid KV cache manager gives it two groups."""
    layers = MODEL_SIZES[size].num_hidden_layers
    kinds = ["sliding_attention", "full_attention"] * (layers // 2) + ["full_attention"] * (
        layers % 2
    )
    return _build(path, size, dtype, seed, {"layer_types": kinds, "sliding_window": window})


def _build(path: Path, size: str, dtype: str, seed: int, extra: dict[str, Any]) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = MODEL_SIZES[size]
    stamp = path / "kvmux-model.json"
    wanted = {"size": size, "dtype": dtype, "seed": seed, **asdict(shape), **extra}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return path
    torch.manual_seed(seed)
    config = LlamaConfig(**asdict(shape), tie_word_embeddings=False, **extra)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))  # type: ignore[no-untyped-call]
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    stamp.write_text(json.dumps(wanted))
    return path
