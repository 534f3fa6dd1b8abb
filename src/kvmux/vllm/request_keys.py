"""What of a vLLM request goes into its kvmux keys, besides the namespace.

The token ids of each full prompt block, and that block's extra keys exactly as vLLM
folds them into its own block hashes: LoRA name and path, multimodal item hashes and
their offsets, ``cache_salt`` and prompt-embedding hashes. vLLM's own block hashes are not
used, since their seed is random per process for some hash algorithms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

from kvmux.keys import encode_extra_keys

if TYPE_CHECKING:
    from vllm.v1.request import Request

__all__ = ["block_extras", "prompt_tokens"]


def prompt_tokens(request: Request) -> Sequence[int]:
    """The prompt's token ids; placeholders for prompt embeddings (keyed by their hashes)."""
    if request.prompt_token_ids is not None:
        return request.prompt_token_ids
    return [0] * int(request.num_prompt_tokens)


def _plain(request: Request) -> bool:
    return not (
        request.lora_request
        or request.cache_salt
        or request.mm_features
        or request.prompt_embeds is not None
    )


def block_extras(request: Request, block_size: int) -> list[bytes] | None:
    """Each full prompt block's encoded extra keys; None for a plain text request.

    Raises UnkeyableInput when an extra key has a type kvmux cannot encode.
    """
    if _plain(request):
        return None
    extras: list[bytes] = []
    mm_index = 0
    for start in range(0, int(request.num_prompt_tokens) - block_size + 1, block_size):
        keys, mm_index = generate_block_hash_extra_keys(
            request, start, start + block_size, mm_index
        )
        extras.append(encode_extra_keys(keys) if keys else b"")
    return extras
