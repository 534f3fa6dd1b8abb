"""kvmux.keys: deterministic, chained, namespaced block keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvmux.errors import UnkeyableInput
from kvmux.keys import (
    DIGEST_SIZE,
    BlockKey,
    block_keys,
    encode_extra_keys,
    namespace_id,
    store_key,
)

BLOCK = 16
NAMESPACE = {"model": "tiny-llama", "dtype": "float32", "block_size": BLOCK, "tp": 1}
TOKENS = [(i * 7919 + 13) % 32000 for i in range(5 * BLOCK + 3)]

_CHILD = """
import json, sys
from kvmux.keys import block_keys, encode_extra_keys, namespace_id, store_key
args = json.loads(sys.argv[1])
ns = namespace_id(args["namespace"])
extras = [encode_extra_keys(e) for e in args["extras"]] if args["extras"] else None
keys = block_keys(ns, args["tokens"], args["block_size"], extras)
print(json.dumps({
    "ns": ns.hex(),
    "keys": [k.hex() for k in keys],
    "store": [store_key(k, 3).hex() for k in keys],
}))
"""


def _vllm_extras(cache_salt: str | None, lora: str | None) -> list[list[object]] | None:
    """Per-block extra keys as vLLM makes them: the salt in block 0, the LoRA in every one."""
    if cache_salt is None and lora is None:
        return None
    blocks: list[list[object]] = []
    for index in range(len(TOKENS) // BLOCK):
        keys: list[object] = [["lora", lora, f"/adapters/{lora}"]] if lora else []
        if cache_salt and index == 0:
            keys.append(["cache_salt", cache_salt])
        blocks.append(keys)
    return blocks


def _extras(cache_salt: str | None, lora: str | None) -> list[bytes] | None:
    blocks = _vllm_extras(cache_salt, lora)
    return None if blocks is None else [encode_extra_keys(b) if b else b"" for b in blocks]


def _local(cache_salt: str | None, lora: str | None) -> dict[str, object]:
    ns = namespace_id(NAMESPACE)
    keys = block_keys(ns, TOKENS, BLOCK, _extras(cache_salt, lora))
    return {
        "ns": ns.hex(),
        "keys": [k.hex() for k in keys],
        "store": [store_key(k, 3).hex() for k in keys],
    }


@pytest.mark.parametrize("hashseed", ["123", "random", "0"])
@pytest.mark.parametrize(("cache_salt", "lora"), [(None, None), ("s3cret", "adapter-a")])
def test_block_keys_agree_across_processes(
    hashseed: str, cache_salt: str | None, lora: str | None
) -> None:
    args = {
        "namespace": NAMESPACE,
        "extras": _vllm_extras(cache_salt, lora),
        "tokens": TOKENS,
        "block_size": BLOCK,
    }
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    assert json.loads(proc.stdout) == _local(cache_salt, lora)


def test_keys_are_digests_of_the_documented_size() -> None:
    keys = block_keys(namespace_id(NAMESPACE), TOKENS, BLOCK)
    assert all(isinstance(k, bytes) and len(k) == DIGEST_SIZE for k in keys)
    assert len(namespace_id(NAMESPACE)) == DIGEST_SIZE
    assert len(store_key(keys[0], 0)) == DIGEST_SIZE


def test_block_keys_are_deterministic_in_process() -> None:
    ns = namespace_id(NAMESPACE)
    assert block_keys(ns, TOKENS, BLOCK) == block_keys(ns, list(TOKENS), BLOCK)
    assert block_keys(ns, tuple(TOKENS), BLOCK) == block_keys(ns, TOKENS, BLOCK)


def test_only_full_blocks_get_keys() -> None:
    ns = namespace_id(NAMESPACE)
    assert block_keys(ns, [], BLOCK) == []
    assert block_keys(ns, TOKENS[: BLOCK - 1], BLOCK) == []
    assert len(block_keys(ns, TOKENS[:BLOCK], BLOCK)) == 1
    assert len(block_keys(ns, TOKENS[: BLOCK + 1], BLOCK)) == 1
    assert len(block_keys(ns, TOKENS[: 2 * BLOCK - 1], BLOCK)) == 1
    assert len(block_keys(ns, TOKENS[: 2 * BLOCK], BLOCK)) == 2
    assert len(block_keys(ns, TOKENS, BLOCK)) == len(TOKENS) // BLOCK == 5


def test_partial_tail_does_not_change_full_block_keys() -> None:
    ns = namespace_id(NAMESPACE)
    full = block_keys(ns, TOKENS[: 2 * BLOCK], BLOCK)
    assert block_keys(ns, [*TOKENS[: 2 * BLOCK], 1, 2, 3], BLOCK) == full


def test_keys_of_a_prefix_are_a_prefix_of_the_keys() -> None:
    ns = namespace_id(NAMESPACE)
    keys = block_keys(ns, TOKENS, BLOCK)
    for blocks in range(len(keys) + 1):
        assert block_keys(ns, TOKENS[: blocks * BLOCK], BLOCK) == keys[:blocks]


def test_changing_block_zero_changes_every_key() -> None:
    ns = namespace_id(NAMESPACE)
    keys = block_keys(ns, TOKENS, BLOCK)
    for position in (0, BLOCK // 2, BLOCK - 1):
        changed = list(TOKENS)
        changed[position] += 1
        other = block_keys(ns, changed, BLOCK)
        assert len(other) == len(keys)
        assert all(a != b for a, b in zip(keys, other, strict=True))


def test_changing_block_two_keeps_earlier_keys() -> None:
    ns = namespace_id(NAMESPACE)
    keys = block_keys(ns, TOKENS, BLOCK)
    changed = list(TOKENS)
    changed[2 * BLOCK + 5] += 1
    other = block_keys(ns, changed, BLOCK)
    assert other[:2] == keys[:2]
    assert all(a != b for a, b in zip(keys[2:], other[2:], strict=True))


def test_same_block_content_at_different_positions_gets_different_keys() -> None:
    ns = namespace_id(NAMESPACE)
    block = TOKENS[:BLOCK]
    keys = block_keys(ns, block * 3, BLOCK)
    assert len(set(keys)) == 3


def test_block_size_is_part_of_the_key() -> None:
    ns = namespace_id(NAMESPACE)
    tokens = TOKENS[: 4 * BLOCK]
    small = block_keys(ns, tokens, BLOCK // 2)
    large = block_keys(ns, tokens, BLOCK)
    assert not set(small) & set(large)


def test_namespace_id_ignores_key_order() -> None:
    forward = {"a": 1, "b": [1, 2], "c": {"x": 1, "y": 2}}
    backward = {"c": {"y": 2, "x": 1}, "b": [1, 2], "a": 1}
    assert list(forward) != list(backward)
    assert namespace_id(forward) == namespace_id(backward)


def test_namespace_id_distinguishes_values() -> None:
    ids = {
        namespace_id({"m": "x"}),
        namespace_id({"m": "y"}),
        namespace_id({"m": "x", "dtype": "float16"}),
        namespace_id({"m": "x", "block_size": 16}),
        namespace_id({"m": "x", "block_size": 32}),
        namespace_id({"m": ["x"]}),
        namespace_id({}),
    }
    assert len(ids) == 7


def test_different_namespaces_give_disjoint_keys() -> None:
    first = block_keys(namespace_id({"m": "x"}), TOKENS, BLOCK)
    second = block_keys(namespace_id({"m": "y"}), TOKENS, BLOCK)
    assert len(first) == len(second) == 5
    assert not set(first) & set(second)


def test_extra_keys_encoding_is_canonical_and_tagged() -> None:
    assert encode_extra_keys(("lora", "a", "/p")) == encode_extra_keys(["lora", "a", "/p"])
    distinct = [
        ("cache_salt", "a"),
        ("cache_salt", b"a"),
        ("mm", "a", 1),
        ("mm", "a", "1"),
        ("mm", "a", True),
        ("mm", ("a",), 1),
        ("mm", "a1", None),
        (("lora", "a", "/p"),),
        (("lora", "a", "/q"),),
    ]
    assert len({encode_extra_keys(e) for e in distinct}) == len(distinct)


def test_unknown_extra_key_types_are_refused() -> None:
    with pytest.raises(UnkeyableInput):
        encode_extra_keys(("mm", 1.5))
    with pytest.raises(UnkeyableInput):
        encode_extra_keys((object(),))


@pytest.mark.parametrize(
    ("cache_salt", "lora"), [("tenant-1", None), (None, "lora-a"), ("tenant-1", "lora-a")]
)
def test_extra_keys_change_every_key(cache_salt: str | None, lora: str | None) -> None:
    ns = namespace_id(NAMESPACE)
    plain = block_keys(ns, TOKENS, BLOCK)
    salted = block_keys(ns, TOKENS, BLOCK, _extras(cache_salt, lora))
    assert not set(plain) & set(salted)


def test_different_cache_salts_and_loras_are_disjoint() -> None:
    ns = namespace_id(NAMESPACE)
    variants = [("a", None), ("b", None), (None, "l1"), (None, "l2"), ("a", "l1")]
    seen: set[BlockKey] = set()
    for cache_salt, lora in variants:
        keys = set(block_keys(ns, TOKENS, BLOCK, _extras(cache_salt, lora)))
        assert not keys & seen
        seen |= keys


def test_an_extra_key_in_a_later_block_changes_that_key_and_the_following() -> None:
    ns = namespace_id(NAMESPACE)
    plain = block_keys(ns, TOKENS, BLOCK)
    image = [b"", b"", encode_extra_keys((("mm", "image-hash", 3),)), b"", b""]
    keyed = block_keys(ns, TOKENS, BLOCK, image)
    assert keyed[:2] == plain[:2]
    assert not set(keyed[2:]) & set(plain)


def test_store_key_differs_per_rank() -> None:
    keys = block_keys(namespace_id(NAMESPACE), TOKENS, BLOCK)
    for key in keys:
        per_rank = [store_key(key, rank) for rank in range(8)]
        assert len(set(per_rank)) == 8
        assert key not in per_rank
        assert store_key(key, 3) == store_key(BlockKey(bytes(key)), 3)
    all_store_keys = {store_key(k, r) for k in keys for r in range(8)}
    assert len(all_store_keys) == len(keys) * 8
