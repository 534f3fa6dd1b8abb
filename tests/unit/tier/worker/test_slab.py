"""kvmux.tier.worker.slab.HostSlab: whole blocks into slots and back, bit for bit, in any layout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvmux.tier.worker.slab import HostSlab, SlotRun, slot_runs  # noqa: E402
from kvmux.tier.worker.transfer import BlockMover  # noqa: E402

NUM_BLOCKS = 8
LAYOUTS = {  # shape of one layer's cache, and the dimension indexing its blocks
    "blocks_first": ((NUM_BLOCKS, 2, 4, 8), 0),
    "blocks_second": ((2, NUM_BLOCKS, 4, 8), 1),
    "odd_rows": ((NUM_BLOCKS, 3, 5), 0),  # 30-byte rows of bfloat16: no wide element fits
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.uint8]


def _random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every bit pattern may appear (NaNs and infinities included), as in a KV cache."""
    generator = torch.Generator().manual_seed(seed)
    size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).view(shape)


def _caches(layout: str, dtype: torch.dtype, seed: int, layers: int = 3) -> dict[str, torch.Tensor]:
    shape, _ = LAYOUTS[layout]
    return {f"layer.{i}": _random_bits(shape, dtype, seed + i) for i in range(layers)}


def _block_bytes(tensor: torch.Tensor, layout: str, block: int) -> bytes:
    view = tensor.select(LAYOUTS[layout][1], block).contiguous()
    return view.view(torch.uint8).numpy().tobytes()


def test_slot_runs_split_at_gaps() -> None:
    assert slot_runs([4, 5, 6, 0, 1, 9]) == [SlotRun(4, 0, 3), SlotRun(0, 3, 2), SlotRun(9, 5, 1)]
    assert slot_runs([]) == []


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_blocks_come_back_bit_for_bit(layout: str, dtype: torch.dtype) -> None:
    source = _caches(layout, dtype, seed=1)
    target = {name: torch.zeros_like(t) for name, t in source.items()}
    saver = HostSlab([BlockMover(source, NUM_BLOCKS)], slots=6)
    saver.save(0, [5, 1, 3, 7], [2, 3, 4, 0])  # two runs of slots, blocks in any order
    loader = HostSlab([BlockMover(target, NUM_BLOCKS)], slots=6)
    loader._arena = saver._arena  # the same slots, seen from another cache
    loader._groups = [loader._group_layers(BlockMover(target, NUM_BLOCKS))]
    loader.load(0, [0, 6, 2, 4], [2, 3, 4, 0])
    for name in source:
        for saved, loaded in ((5, 0), (1, 6), (3, 2), (7, 4)):
            assert _block_bytes(target[name], layout, loaded) == _block_bytes(
                source[name], layout, saved
            )
        for untouched in (1, 3, 5, 7):
            assert not target[name].select(LAYOUTS[layout][1], untouched).any()


def test_one_slab_serves_groups_of_different_sizes() -> None:
    full = _caches("blocks_first", torch.float32, seed=3, layers=3)
    window = {
        f"w.{i}": t for i, t in enumerate(_caches("blocks_first", torch.float32, 7, 1).values())
    }
    slab = HostSlab([BlockMover(full, NUM_BLOCKS), BlockMover(window, NUM_BLOCKS)], slots=4)
    per_layer = 2 * 4 * 8 * 4
    assert slab.slot_bytes == 3 * per_layer
    assert (slab.block_bytes(0), slab.block_bytes(1)) == (3 * per_layer, per_layer)
    slab.save(0, [2], [0])
    slab.save(1, [5], [1])
    expected_window = window["w.0"][5].clone()
    window["w.0"].zero_()
    slab.load(1, [3], [1])
    assert torch.equal(window["w.0"][3], expected_window)


def test_slots_are_preallocated_once() -> None:
    caches = _caches("blocks_first", torch.float32, seed=5)
    slab = HostSlab([BlockMover(caches, NUM_BLOCKS)], slots=16)
    before = [t.data_ptr() for t in slab._arena]
    slab.save(0, list(range(8)), list(range(8)))
    slab.load(0, list(range(8)), list(range(8)))
    assert [t.data_ptr() for t in slab._arena] == before
    assert sum(t.numel() for t in slab._arena) == 16 * slab.slot_bytes


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["blocks_first", "blocks_second"])
def test_save_reuse_and_load_on_every_device(device: str, layout: str) -> None:
    """Saves, a slot reused by a later save, and loads, in order, on the host or a GPU."""
    source = {k: v.to(device) for k, v in _caches(layout, torch.bfloat16, seed=11).items()}
    slab = HostSlab([BlockMover(source, NUM_BLOCKS)], slots=3)
    assert all(t.is_pinned() == (device == "cuda") for t in slab._arena)
    dim = LAYOUTS[layout][1]
    originals = {name: t.clone() for name, t in source.items()}
    slab.save(0, [0, 1, 2], [0, 1, 2])
    slab.load(0, [5, 6], [0, 1])  # slots 0 and 1 read back ...
    slab.save(0, [3], [0])  # ... before slot 0 is reused
    slab.load(0, [7], [0])
    slab.flush()
    if device == "cuda":
        torch.cuda.synchronize()
    for name, tensor in source.items():
        for loaded, saved in ((5, 0), (6, 1), (7, 3)):
            got, want = tensor.select(dim, loaded), originals[name].select(dim, saved)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # NaNs too


@pytest.mark.parametrize("device", DEVICES)
def test_a_block_reused_after_its_saves_mark_is_saved_as_it_was(device: str) -> None:
    """On a GPU the save returns with its copies in flight; once the forward stream is
    ordered after its mark, overwriting the block on it cannot reach the slot."""
    source = {k: v.to(device) for k, v in _caches("blocks_first", torch.float32, seed=13).items()}
    slab = HostSlab([BlockMover(source, NUM_BLOCKS)], slots=2)
    originals = {name: t[2].clone() for name, t in source.items()}
    mark = slab.save(0, [2], [0])
    assert (mark is None) == (device == "cpu")  # the host's copies are done at return
    if mark is not None:
        mark.order([torch.cuda.current_stream()])  # the GPU waits, not the host
    for tensor in source.values():
        tensor[2].fill_(0.0)  # the block handed to another request, on the forward stream
    slab.load(0, [4], [0])
    slab.flush()
    if device == "cuda":
        torch.cuda.synchronize()
    for name, tensor in source.items():
        assert torch.equal(tensor[4].view(torch.int32), originals[name].view(torch.int32))
