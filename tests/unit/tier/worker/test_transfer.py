"""kvmux.tier.worker.transfer.BlockMover on small CPU tensors."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from kvmux import codec  # noqa: E402
from kvmux.codec import LayerSpec  # noqa: E402
from kvmux.errors import CorruptEntry, UnsupportedLayout  # noqa: E402
from kvmux.keys import namespace_id  # noqa: E402
from kvmux.tier.worker.streams import RecordingStreams  # noqa: E402
from kvmux.tier.worker.transfer import BlockMover, CopyStream  # noqa: E402

NUM_BLOCKS = 6
NS = namespace_id({"m": "x"})
KEY = b"k" * 16
LAYOUTS = {"blocks_first": (NUM_BLOCKS, 2, 4, 8), "blocks_second": (2, NUM_BLOCKS, 4, 8)}


def _dim(layout: str) -> int:
    return 0 if layout == "blocks_first" else 1


def _caches(layout: str, seed: int | None = 0, dtype: torch.dtype = torch.float32) -> dict:
    shape = LAYOUTS[layout]
    if seed is None:
        return {f"layer.{i}": torch.zeros(shape, dtype=dtype) for i in range(2)}
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(shape, generator=generator).to(dtype) for i in range(2)}


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_layer_specs(layout: str) -> None:
    mover = BlockMover(_caches(layout), NUM_BLOCKS)
    expected = LayerSpec((2, 4, 8), "float32")
    assert mover.layer_specs == (expected, expected)
    assert sum(spec.nbytes for spec in mover.layer_specs) == 2 * 2 * 4 * 8 * 4
    assert mover.device == torch.device("cpu")


def test_block_dimension_defaults_to_zero_without_num_blocks() -> None:
    mover = BlockMover(_caches("blocks_second"), None)
    assert mover.layer_specs[0].shape == (NUM_BLOCKS, 4, 8)


@pytest.mark.parametrize(
    "shape",
    [(4, 2, 16, 2, 8), (NUM_BLOCKS + 1, 16, 8)],  # blocks third; no dimension of NUM_BLOCKS
)
def test_an_unknown_layout_fails_loudly_with_its_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(UnsupportedLayout, match=re.escape(str(shape))):
        BlockMover({"layer.0": torch.zeros(shape)}, NUM_BLOCKS)


def test_gpu_layouts_find_their_block_dimension() -> None:
    flash_attention = torch.zeros(2, NUM_BLOCKS, 16, 2, 8)  # [2, blocks, size, heads, dim]
    flash_infer = torch.zeros(NUM_BLOCKS, 2, 16, 2, 8)  # [blocks, 2, size, heads, dim]
    mla = torch.zeros(NUM_BLOCKS, 16, 8)  # [blocks, size, latent]
    for tensor, dim in ((flash_attention, 1), (flash_infer, 0), (mla, 0)):
        assert BlockMover({"layer.0": tensor}, NUM_BLOCKS).kv_layers[0][1] == dim


def test_copy_out(layout: str) -> None:
    caches = _caches(layout)
    dim = _dim(layout)
    mover = BlockMover(caches, NUM_BLOCKS)
    copies = mover.copy_out([1, 3])
    assert len(copies) == 2
    for copy, tensor in zip(copies, caches.values(), strict=True):
        assert copy.shape == (2, 2, 4, 8)
        assert copy.is_contiguous()
        assert torch.equal(copy[0], tensor.select(dim, 1))
        assert torch.equal(copy[1], tensor.select(dim, 3))
    # copies are independent of the cache
    before = copies[0].clone()
    for tensor in caches.values():
        tensor.zero_()
    assert torch.equal(copies[0], before)


def test_block_parts_are_the_raw_bytes(layout: str) -> None:
    caches = _caches(layout)
    dim = _dim(layout)
    mover = BlockMover(caches, NUM_BLOCKS)
    copies = mover.copy_out([2, 5])
    for row, block in enumerate([2, 5]):
        parts = BlockMover.block_parts(copies, row)
        assert [p.nbytes for p in parts] == [s.nbytes for s in mover.layer_specs]
        for part, tensor in zip(parts, caches.values(), strict=True):
            assert bytes(part) == tensor.select(dim, block).contiguous().numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_copy_out_encode_decode_copy_in(layout: str, dtype: torch.dtype) -> None:
    source = _caches(layout, seed=1, dtype=dtype)
    target = _caches(layout, seed=None, dtype=dtype)
    dim = _dim(layout)
    out_mover = BlockMover(source, NUM_BLOCKS)
    in_mover = BlockMover(target, NUM_BLOCKS)
    copies = out_mover.copy_out([1, 3])
    for row, (src_block, dst_block) in enumerate([(1, 4), (3, 5)]):
        data = codec.encode(NS, KEY, out_mover.layer_specs, BlockMover.block_parts(copies, row))
        in_mover.copy_in(dst_block, codec.decode(data, NS, KEY))
        for src, dst in zip(source.values(), target.values(), strict=True):
            assert torch.equal(dst.select(dim, dst_block), src.select(dim, src_block))
    for dst in target.values():
        for untouched in range(4):
            assert not dst.select(dim, untouched).any()


def test_copy_in_rejects_a_different_layout() -> None:
    source = BlockMover(_caches("blocks_first"), NUM_BLOCKS)
    copies = source.copy_out([0])
    data = codec.encode(NS, KEY, source.layer_specs, BlockMover.block_parts(copies, 0))
    entry = codec.decode(data, NS, KEY)
    narrow = {f"l{i}": torch.zeros(NUM_BLOCKS, 2, 4, 4) for i in range(2)}
    with pytest.raises(CorruptEntry):
        BlockMover(narrow, NUM_BLOCKS).copy_in(1, entry)
    half = {f"l{i}": torch.zeros(NUM_BLOCKS, 2, 4, 8, dtype=torch.float16) for i in range(2)}
    with pytest.raises(CorruptEntry):
        BlockMover(half, NUM_BLOCKS).copy_in(1, entry)
    one_layer = {"l0": torch.zeros(NUM_BLOCKS, 2, 4, 8)}
    with pytest.raises(CorruptEntry):
        BlockMover(one_layer, NUM_BLOCKS).copy_in(1, entry)


def test_unsupported_dtype() -> None:
    with pytest.raises(TypeError, match="dtype"):
        BlockMover({"l0": torch.zeros(NUM_BLOCKS, 2, dtype=torch.float64)}, NUM_BLOCKS)


# -- the device-neutral batch path: the same test on the host and, where there is one, a GPU


DEVICES = [
    "cpu",
    "streamed",  # a host cache through the GPU path, with recording streams
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stage_rows", [1, 64], ids=lambda r: f"stage{r}")
def test_batched_copies_round_trip_on_every_device(
    layout: str, device: str, dtype: torch.dtype, stage_rows: int
) -> None:
    """copy_out, then copy_in_many, move exactly the listed blocks and nothing else."""
    on = "cpu" if device == "streamed" else device
    source = {k: v.to(on) for k, v in _caches(layout, seed=2, dtype=dtype).items()}
    target = {k: v.to(on) for k, v in _caches(layout, seed=None, dtype=dtype).items()}
    dim = _dim(layout)
    streams = RecordingStreams() if device == "streamed" else None
    out_mover = BlockMover(source, NUM_BLOCKS)
    in_mover = BlockMover(target, NUM_BLOCKS, streams)
    in_mover._stage_rows = stage_rows
    copies = out_mover.copy_out([1, 3, 0])
    assert all(c.device.type == "cpu" for c in copies)
    entries = []
    for row in range(3):
        data = codec.encode(NS, KEY, out_mover.layer_specs, BlockMover.block_parts(copies, row))
        entry = codec.decode(data, NS, KEY)
        in_mover.check(entry)
        entries.append(entry)
    in_mover.copy_in_many([4, 5, 2], entries)
    if device == "cuda":
        torch.cuda.synchronize()
    for src, dst in zip(source.values(), target.values(), strict=True):
        for src_block, dst_block in [(1, 4), (3, 5), (0, 2)]:
            assert torch.equal(dst.select(dim, dst_block), src.select(dim, src_block))
        for untouched in (0, 1, 3):
            assert not dst.select(dim, untouched).any()


def test_check_refuses_an_entry_of_another_layout() -> None:
    source = BlockMover(_caches("blocks_first"), NUM_BLOCKS)
    data = codec.encode(
        NS, KEY, source.layer_specs, BlockMover.block_parts(source.copy_out([0]), 0)
    )
    narrow = {f"l{i}": torch.zeros(NUM_BLOCKS, 2, 4, 4) for i in range(2)}
    with pytest.raises(CorruptEntry):
        BlockMover(narrow, NUM_BLOCKS).check(codec.decode(data, NS, KEY))


def test_staged_loads_reuse_their_host_buffer_and_never_wait_on_the_host() -> None:
    source = BlockMover(_caches("blocks_second", seed=3), NUM_BLOCKS)
    streams = RecordingStreams()
    target = BlockMover(_caches("blocks_second", seed=None), NUM_BLOCKS, streams)
    copies = source.copy_out([0, 1])
    entries = [
        codec.decode(
            codec.encode(NS, KEY, source.layer_specs, source.block_parts(copies, r)), NS, KEY
        )
        for r in range(2)
    ]
    target.copy_in_many([2, 3], entries)
    (buffer,) = [b for b, _ in target._staging._free]
    target.copy_in_many([4, 5], entries)
    assert [b.data_ptr() for b, _ in target._staging._free] == [buffer.data_ptr()]
    assert all(event.host_waits == 0 for event in streams.forward.recorded)


def test_a_fence_orders_every_tiers_loader_stream_on_the_device() -> None:
    """Under MuxConnector each tier has a loader stream; a block one tier saved may be
    loaded into by another's: each fence names them all, and the forward stream."""
    streams = RecordingStreams()
    memory, disk = (
        CopyStream(torch.device("cpu"), streams),
        CopyStream(torch.device("cpu"), streams),
    )
    assert memory.writers() == [streams.forward, *streams.streams]
    assert disk.writers() == memory.writers() and len(streams.streams) == 2
    disk.close()
    assert memory.writers() == [streams.forward, streams.streams[0]]
    memory.close()
    assert CopyStream(torch.device("cpu")).writers() == []  # the host: nothing in flight


def test_a_failed_load_still_waits_for_the_copies_it_submitted() -> None:
    streams = RecordingStreams()
    copies = CopyStream(torch.device("cpu"), streams)
    with pytest.raises(OSError), copies.active():
        assert streams.current() is streams.streams[0]
        raise OSError("the store went away mid-load")
    assert streams.streams[0].synchronized == 1 and streams.current() is streams.forward
    copies.close()
