"""kvmux.vllm.request_keys: kvmux keys fold in everything vLLM folds into its block hashes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvmux.errors import UnkeyableInput
from kvmux.keys import block_keys, namespace_id
from kvmux.vllm.request_keys import block_extras, prompt_tokens, saves_generated
from tests.unit.vllm.test_store_connector import fake_request

BLOCK = 16
NS = namespace_id({"model": "unit"})


def keys_of(request: Any) -> list[bytes]:
    return block_keys(NS, prompt_tokens(request), BLOCK, block_extras(request, BLOCK))


def lora(name: str, path: str) -> SimpleNamespace:
    return SimpleNamespace(lora_name=name, lora_path=path, lora_int_id=1)


def image(identifier: str, offset: int, length: int) -> SimpleNamespace:
    return SimpleNamespace(
        identifier=identifier, mm_position=SimpleNamespace(offset=offset, length=length)
    )


def test_a_plain_text_request_has_no_extra_keys() -> None:
    assert block_extras(fake_request("r", 5 * BLOCK), BLOCK) is None


def test_lora_is_keyed_by_name_and_path() -> None:
    base = keys_of(fake_request("r", 4 * BLOCK))
    a = keys_of(fake_request("r", 4 * BLOCK, lora_request=lora("a", "/adapters/a")))
    a_moved = keys_of(fake_request("r", 4 * BLOCK, lora_request=lora("a", "/adapters/a2")))
    again = keys_of(fake_request("r", 4 * BLOCK, lora_request=lora("a", "/adapters/a")))
    assert a == again
    assert len({*base, *a, *a_moved}) == 3 * len(base)


def test_cache_salt_changes_every_key() -> None:
    plain = keys_of(fake_request("r", 4 * BLOCK))
    salted = keys_of(fake_request("r", 4 * BLOCK, cache_salt="tenant"))
    other = keys_of(fake_request("r", 4 * BLOCK, cache_salt="other"))
    assert len({*plain, *salted, *other}) == 3 * len(plain)


def test_images_behind_the_same_placeholder_tokens_get_different_keys() -> None:
    """Placeholder token ids are the same for every image: the image hash tells them apart."""
    tokens = [7] * (4 * BLOCK)  # prompt of placeholders
    cat = keys_of(
        fake_request("r", 4 * BLOCK, prompt_token_ids=tokens, mm_features=[image("cat", 20, 24)])
    )
    dog = keys_of(
        fake_request("r", 4 * BLOCK, prompt_token_ids=tokens, mm_features=[image("dog", 20, 24)])
    )
    plain = keys_of(fake_request("r", 4 * BLOCK, prompt_token_ids=tokens))
    assert cat[0] == dog[0] == plain[0]  # block 0 holds no image
    assert not set(cat[1:]) & set(dog[1:])
    assert not set(cat[1:]) & set(plain[1:])


def test_prompt_embeddings_are_keyed_by_their_contents() -> None:
    generator = torch.Generator().manual_seed(0)
    first = torch.randn(4 * BLOCK, 8, generator=generator)
    second = first.clone()
    second[3 * BLOCK + 1, 0] += 1.0  # one value of the last block differs

    def embeds(values: torch.Tensor) -> Any:
        return fake_request("r", 4 * BLOCK, prompt_token_ids=None, prompt_embeds=values)

    one, same, other = (
        keys_of(embeds(first)),
        keys_of(embeds(first.clone())),
        keys_of(embeds(second)),
    )
    assert one == same
    assert one[:3] == other[:3]
    assert one[3] != other[3]
    assert prompt_tokens(embeds(first)) == [0] * (4 * BLOCK)


def test_an_extra_key_kvmux_cannot_encode_makes_the_request_unkeyable() -> None:
    odd = fake_request("r", 2 * BLOCK, mm_features=[image(1.5, 0, 4)])  # type: ignore[arg-type]
    with pytest.raises(UnkeyableInput):
        block_extras(odd, BLOCK)


def test_generated_blocks_have_the_extra_keys_vllm_gives_them() -> None:
    request = fake_request("r", 3 * BLOCK + 5, lora_request=lora("a", "/adapters/a"))
    prompt = block_extras(request, BLOCK)
    grown = block_extras(request, BLOCK, 6 * BLOCK)
    assert prompt is not None and grown is not None
    assert grown[:3] == prompt and len(grown) == 6
    assert len(set(grown)) == 1  # the adapter on every block, nothing else
    assert block_extras(fake_request("r", 3 * BLOCK), BLOCK, 6 * BLOCK) is None


@pytest.mark.parametrize(
    ("params", "default", "expected"),
    [
        (None, False, False),
        (None, True, True),
        ({}, True, True),
        ({"offload_prompt_only": False}, False, True),
        ({"offload_prompt_only": True}, True, False),
        ({"offload_prompt_only": "no"}, True, True),  # a bad value: the tier's default
        ({"do_remote_prefill": True}, False, False),
    ],
)
def test_kv_transfer_params_turn_generated_saves_on_or_off(
    params: dict[str, Any] | None, default: bool, expected: bool
) -> None:
    request = fake_request("r", 2 * BLOCK, kv_transfer_params=params)
    assert saves_generated(request, default) is expected  # type: ignore[arg-type]


def test_prompt_embeddings_save_their_prompt_blocks_only() -> None:
    request = fake_request(
        "r", 2 * BLOCK, prompt_embeds=torch.zeros(2 * BLOCK, 4), kv_transfer_params=None
    )
    assert saves_generated(request, True) is False  # type: ignore[arg-type]
