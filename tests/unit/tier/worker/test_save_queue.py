"""The save queue's size: set in the configuration, or following the engine's batch."""

from __future__ import annotations

from kvmux.tier.worker.save_queue import FLOOR_BYTES, HOST_SHARE, SaveQueueSizing

GIB = 2**30
LLAMA_8B_FP32_BLOCK = 128 * 256 * 2**10  # 128 tokens of 32 layers x 8 KV heads x 128 x 4 B


def test_a_configured_size_wins() -> None:
    sizing = SaveQueueSizing(64 * 2**20, batched_tokens=8192, block_size=128, host_bytes=GIB)
    size = sizing.size(LLAMA_8B_FP32_BLOCK)
    assert size.bytes == 64 * 2**20
    assert size.tokens == 2 * 128  # two whole blocks
    assert "set in the configuration" in size.describe()


def test_the_default_holds_two_of_the_engines_largest_steps() -> None:
    sizing = SaveQueueSizing(None, batched_tokens=8192, block_size=128, host_bytes=512 * GIB)
    size = sizing.size(LLAMA_8B_FP32_BLOCK)
    assert size.tokens >= 2 * 8192
    assert size.bytes == size.tokens // 128 * LLAMA_8B_FP32_BLOCK
    assert size.describe().startswith("2.0 steps of 8,192 tokens (16,640 tokens), 4.06 GiB")


def test_a_2049_token_prompt_of_an_8b_model_fits_where_the_old_256mib_did_not() -> None:
    sizing = SaveQueueSizing(None, batched_tokens=2048, block_size=128, host_bytes=24 * GIB)
    assert sizing.size(LLAMA_8B_FP32_BLOCK).tokens >= 2048
    assert FLOOR_BYTES // LLAMA_8B_FP32_BLOCK * 128 == 1024  # what it held before


def test_the_host_share_caps_it_split_among_the_ranks() -> None:
    host = 16 * GIB
    sizing = SaveQueueSizing(
        None, batched_tokens=65536, block_size=16, ranks_on_host=2, host_bytes=host
    )
    size = sizing.size(16 * 128 * 2**10)
    assert size.bytes == int(host * HOST_SHARE) // 2
    assert "capped at" in size.reason


def test_a_tiny_model_keeps_the_floor_and_an_unknown_engine_gets_it() -> None:
    tiny = SaveQueueSizing(None, batched_tokens=256, block_size=128, host_bytes=24 * GIB)
    assert tiny.size(128 * 1024).bytes == FLOOR_BYTES
    assert SaveQueueSizing(None).size(4096).bytes == FLOOR_BYTES
    assert SaveQueueSizing(None).size(4096).tokens == 0  # no block size known
