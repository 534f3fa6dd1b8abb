"""kvmux.tier.worker.slab.HostSlab's GPU path, run on the host with recording streams."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from kvmux.tier.worker.slab import HostSlab, SlotEvents  # noqa: E402
from kvmux.tier.worker.streams import RecordingStreams  # noqa: E402
from kvmux.tier.worker.transfer import BlockMover  # noqa: E402

NUM_BLOCKS = 12
LAYOUTS = {  # vLLM's GPU layouts of one layer (small), and the dimension of blocks
    "flash_attention": ((2, NUM_BLOCKS, 4, 2, 8), 1),
    "flashinfer": ((NUM_BLOCKS, 2, 4, 2, 8), 0),
    "mla": ((NUM_BLOCKS, 4, 36), 0),
}


def _caches(layout: str, dtype: torch.dtype, seed: int, layers: int = 3) -> dict[str, Any]:
    shape, _ = LAYOUTS[layout]
    generator = torch.Generator().manual_seed(seed)
    caches = {}
    for i in range(layers):
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)
        caches[f"layer.{i}"] = raw.view(dtype).view(shape)
    return caches


def _streamed(caches: dict[str, Any], slots: int) -> tuple[HostSlab, RecordingStreams]:
    streams = RecordingStreams()
    return HostSlab([BlockMover(caches, NUM_BLOCKS)], slots, streams), streams


def _block(tensor: Any, layout: str, block: int) -> bytes:
    view = tensor.select(LAYOUTS[layout][1], block).contiguous()
    return bytes(view.view(torch.uint8).numpy().tobytes())


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32], ids=str)
@pytest.mark.parametrize("stage_rows", [1, 2, 64], ids=lambda r: f"stage{r}")
def test_the_gpu_path_round_trips_bit_for_bit(
    layout: str, dtype: torch.dtype, stage_rows: int
) -> None:
    """Chunked staging, runs of slots, any block order: every bit comes back."""
    source = _caches(layout, dtype, seed=1)
    originals = {name: t.clone() for name, t in source.items()}
    slab, _ = _streamed(source, slots=8)
    slab._stage_rows = stage_rows
    slab.save(0, [5, 1, 3, 7, 9], [2, 3, 4, 0, 6])  # three runs of slots
    slab.load(0, [0, 6, 2, 4, 11], [2, 3, 4, 0, 6])
    for name, tensor in source.items():
        for saved, loaded in ((5, 0), (1, 6), (3, 2), (7, 4), (9, 11)):
            assert _block(tensor, layout, loaded) == _block(originals[name], layout, saved)
        for untouched in (8, 10):
            assert _block(tensor, layout, untouched) == _block(originals[name], layout, untouched)


def test_a_save_orders_after_the_forward_pass_and_the_host_never_waits() -> None:
    slab, streams = _streamed(_caches("flash_attention", torch.bfloat16, seed=2), slots=4)
    mark = slab.save(0, [1, 2], [0, 1])
    assert mark is not None
    (save_stream,) = streams.streams
    written = streams.forward.recorded[0]
    assert save_stream.waited == [written]  # after the forward pass's writes, nothing else
    assert mark.event is save_stream.recorded[-1] and mark.event.host_waits == 0
    mark.order([streams.forward])
    assert streams.forward.waited == [mark.event]


def test_a_load_waits_only_for_the_saves_of_the_slots_it_reads() -> None:
    slab, streams = _streamed(_caches("flashinfer", torch.bfloat16, seed=3), slots=6)
    first = slab.save(0, [1], [0])
    second = slab.save(0, [2], [1])
    assert first is not None and second is not None
    slab.load(0, [5], [0])  # slot 0: the first save only
    assert streams.forward.waited == [first.event]
    loader = streams.new_stream()
    with streams.using(loader):
        slab.load(0, [6, 7], [0, 1])
    assert loader.waited == [first.event, second.event]
    slab.load(0, [8], [4])  # a slot never saved waits for nothing
    assert streams.forward.waited == [first.event]


def test_a_save_into_a_slot_waits_for_its_loads_on_every_stream() -> None:
    slab, streams = _streamed(_caches("mla", torch.bfloat16, seed=4), slots=4)
    slab.save(0, [1, 2], [0, 1])
    loader = streams.new_stream()
    slab.load(0, [5], [0])  # on the forward stream
    with streams.using(loader):
        slab.load(0, [6], [0])  # and on the loader's
    forward_load, loader_load = streams.forward.recorded[-1], loader.recorded[-1]
    save_stream = streams.streams[0]
    save_stream.waited.clear()
    slab.save(0, [3], [0])  # reuses slot 0: both loads must have read it
    assert set(map(id, save_stream.waited[1:])) == {id(forward_load), id(loader_load)}
    save_stream.waited.clear()
    slab.save(0, [4], [2])  # slot 2 was never loaded: only the forward pass's writes
    assert len(save_stream.waited) == 1


class _Copies(TorchDispatchMode):
    """Counts copies into one tensor's memory."""

    def __init__(self, target: Any):
        super().__init__()
        self.target = target.untyped_storage().data_ptr()
        self.into = 0
        self.out_of = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.copy_.default:
            if args[0].untyped_storage().data_ptr() == self.target:
                self.into += 1
            if args[1].untyped_storage().data_ptr() == self.target:
                self.out_of += 1
        return func(*args, **(kwargs or {}))


def test_one_host_copy_per_run_of_slots_not_per_layer() -> None:
    slab, _ = _streamed(_caches("flash_attention", torch.bfloat16, seed=5, layers=8), slots=8)
    with _Copies(slab._slots) as copies:
        slab.save(0, [1, 2, 3, 7, 8], [0, 1, 2, 5, 6])  # two runs, eight layers
        slab.load(0, [4, 5, 6, 9, 10], [0, 1, 2, 5, 6])
    assert (copies.into, copies.out_of) == (2, 2)


def test_slot_events_keep_the_latest_save_and_each_streams_latest_load() -> None:
    events = SlotEvents(4)
    events.saved([0, 1], "s1")
    events.saved([1], "s2")
    assert events.saves_of([0, 1, 2]) == ["s1", "s2"]
    events.loaded([0], "forward", "l1")
    events.loaded([0], "forward", "l2")
    events.loaded([0, 3], "loader", "l3")
    assert events.loads_of([0]) == ["l2", "l3"] and events.loads_of([1, 2]) == []


class _Handle:
    """A stream as torch.cuda.current_stream() returns it: a new object each call, equal
    (and hashing the same) where the CUDA stream is the same."""

    def __init__(self, handle: int):
        self.handle = handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Handle) and other.handle == self.handle

    def __hash__(self) -> int:
        return hash(self.handle)


def test_a_streams_loads_are_known_by_its_handle_not_by_its_python_object() -> None:
    events = SlotEvents(2)
    events.loaded([0], _Handle(7), "forward 1")
    events.loaded([0], _Handle(9), "loader")
    events.loaded([0], _Handle(7), "forward 2")  # the same stream, another object
    assert events.loads_of([0]) == ["forward 2", "loader"]
