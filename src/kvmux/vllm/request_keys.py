"""What of a vLLM request goes into its kvmux keys, besides the namespace.

The token ids of each full prompt block, and that block's extra keys exactly as vLLM
folds them into its own block hashes: LoRA name and path, multimodal item hashes and
their offsets, ``cache_salt`` and prompt-embedding hashes. vLLM's own block hashes are not
used, since their seed is random per process for some hash algorithms.

A request may have its generated blocks saved too (``saves_generated``): their keys
continue the chain over the request's every token, with vLLM's extra keys of each block.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

from kvmux.keys import encode_extra_keys

if TYPE_CHECKING:
    from vllm.v1.request import Request

__all__ = ["PROMPT_ONLY_PARAM", "block_extras", "prompt_tokens", "saves_generated"]

log = logging.getLogger(__name__)
PROMPT_ONLY_PARAM = "offload_prompt_only"  # kv_transfer_params key, as vLLM's config key


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


def block_extras(
    request: Request, block_size: int, num_tokens: int | None = None
) -> list[bytes] | None:
    """Each full block's encoded extra keys; None for a plain text request.

    The blocks of the prompt, or of its first ``num_tokens`` tokens (generated included).
    Raises UnkeyableInput when an extra key has a type kvmux cannot encode.
    """
    if _plain(request):
        return None
    extras: list[bytes] = []
    mm_index = 0
    length = int(request.num_prompt_tokens) if num_tokens is None else num_tokens
    for start in range(0, length - block_size + 1, block_size):
        keys, mm_index = generate_block_hash_extra_keys(
            request, start, start + block_size, mm_index
        )
        extras.append(encode_extra_keys(keys) if keys else b"")
    return extras


def saves_generated(request: Request, default: bool) -> bool:
    """Whether the request's generated blocks are saved too (``default``: the tier's).

    ``kv_transfer_params={"offload_prompt_only": false}`` turns it on for one request,
    ``true`` off. A request of prompt embeddings saves its prompt blocks only.
    """
    if request.prompt_embeds is not None:
        return False
    params: Mapping[str, Any] | None = request.kv_transfer_params
    value = params.get(PROMPT_ONLY_PARAM) if isinstance(params, Mapping) else None
    if value is None:
        return default
    if isinstance(value, bool):
        return not value
    log.warning(
        "kvmux: kv_transfer_params %s must be true or false, got %r; ignored",
        PROMPT_ONLY_PARAM,
        value,
    )
    return default
