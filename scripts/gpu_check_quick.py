"""kvmux's GPU path, checked in minutes with torch alone: no vLLM, no network.

Run through ``bash scripts/gpu_check.sh --quick [--device cpu] [--json PATH]``. It drives
kvmux's own workers (the memory tier's slots and a disk tier) over KV caches shaped as
vLLM lays them out on GPUs, at Llama 3.1 8B's size (32 layers, 8 KV heads of 128, blocks
of 16 tokens), and checks:

- layouts: FlashAttention ``[2, blocks, 16, 8, 128]``, FlashInfer ``[blocks, 2, ...]`` and
  MLA ``[blocks, 16, 576]``, in bf16 and fp8, find their block dimension and size;
- round trips through memory and disk are byte-exact (every bit pattern, NaNs too);
- stream hazards (CUDA): a save after the forward pass's writes sees them; a block saved,
  then rewritten in the next step, keeps the saved bytes; an aborted asynchronous load
  writes nothing once it is reported;
- no host synchronisation on the forward path (CUDA: ``set_sync_debug_mode("error")``
  around bind, load, save and the start of an asynchronous load);
- save and load throughput beside a plain copy of the same bytes, the forward
  stream's slowdown while saves run (CUDA), and pinned host memory against capacity.

It prints one table and writes the same figures as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def _refuse_vllm_and_network() -> None:
    """Prove the claim: importing vLLM fails here, and so does any network connection."""
    real_import = builtins.__import__

    def guarded(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("gpu_check --quick runs without vLLM")
        return real_import(name, *args, **kwargs)

    builtins.__import__ = guarded
    real_connect = socket.socket.connect

    def local_only(self: socket.socket, address: Any) -> Any:
        if self.family == socket.AF_UNIX:
            return real_connect(self, address)
        raise OSError("gpu_check --quick uses no network")

    socket.socket.connect = local_only  # type: ignore[method-assign,assignment]


_refuse_vllm_and_network()

import torch  # noqa: E402

from kvmux import codec  # noqa: E402
from kvmux.keys import block_keys, namespace_id  # noqa: E402
from kvmux.metrics import TierStats  # noqa: E402
from kvmux.stores.disk import DiskStore  # noqa: E402
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, TierStepPlan  # noqa: E402
from kvmux.tier.shards import block_shards  # noqa: E402
from kvmux.tier.worker.base import WorkerBase  # noqa: E402
from kvmux.tier.worker.slab import HostSlab  # noqa: E402
from kvmux.tier.worker.slab_worker import SlabWorker  # noqa: E402
from kvmux.tier.worker.store_worker import StoreWorker  # noqa: E402
from kvmux.tier.worker.streams import RecordingStreams  # noqa: E402
from kvmux.tier.worker.transfer import BlockMover  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BLOCK, LATENT = 32, 8, 128, 16, 576  # Llama 3.1 8B; MLA's latent
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
GiB = 2**30
Caches = dict[str, torch.Tensor]
NAMESPACE = namespace_id({"check": "gpu_check --quick"})


@dataclass
class Row:
    """One line of the table (and of the JSON)."""

    check: str
    layout: str = ""
    dtype: str = ""
    ok: bool = True
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    skipped: bool = False


@dataclass
class Run:
    """Where the checks run and what they found."""

    device: torch.device
    blocks: int
    rows: list[Row] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        mark = "skip" if row.skipped else "ok  " if row.ok else "FAIL"
        print(f"  {mark} {row.check:<22} {row.layout:<15} {row.dtype:<5} {row.note}", flush=True)
        return row

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _shape(layout: str, blocks: int) -> tuple[tuple[int, ...], int]:
    """One layer's KV cache shape in vLLM's GPU layout, and its block dimension."""
    if layout == "flash_attention":
        return (2, blocks, BLOCK, HEADS, HEAD_DIM), 1
    if layout == "flashinfer":
        return (blocks, 2, BLOCK, HEADS, HEAD_DIM), 0
    return (blocks, BLOCK, LATENT), 0  # mla


LAYOUTS = ("flash_attention", "flashinfer", "mla")


def _caches(run: Run, layout: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every layer's cache, filled with random bits (any pattern: NaNs and infinities)."""
    shape, _ = _shape(layout, run.blocks)
    caches = {}
    for layer in range(LAYERS):
        raw = torch.empty(shape, dtype=dtype, device=run.device).view(torch.uint8)
        raw.random_(0, 256)
        caches[f"model.layers.{layer}.self_attn"] = raw.view(dtype)
    return caches


def _blocks_of(caches: dict[str, torch.Tensor], dim: int, ids: list[int]) -> list[torch.Tensor]:
    """Host copies of blocks ``ids`` of every layer, as bytes."""
    index = torch.tensor(ids, device=next(iter(caches.values())).device)
    return [t.view(torch.uint8).index_select(dim, index).cpu() for t in caches.values()]


def _scramble(caches: dict[str, torch.Tensor], dim: int, ids: list[int]) -> None:
    """Overwrite blocks ``ids`` of every layer (another request's tokens)."""
    for tensor in caches.values():
        raw = tensor.view(torch.uint8)
        for block in ids:
            raw.select(dim, block).random_(0, 256)


def _plan(step: int, keys: list[Any], ids: list[int], fence: int = 0) -> TierStepPlan:
    return TierStepPlan(
        saves=[BlockTransfer(k, b) for k, b in zip(keys, ids, strict=False)], step=step, fence=fence
    )


def _disk_worker(directory: Path, block_bytes: int, count: int) -> StoreWorker:
    """A disk tier with room for ``count`` blocks in its store and its save queue."""
    store = DiskStore(directory, capacity=4 * count * block_bytes)
    return StoreWorker(store, NAMESPACE, 0, TierStats(), save_queue=2 * count * block_bytes)


def _workers(run: Run, directory: Path, block_bytes: int, count: int) -> dict[str, WorkerBase]:
    """A memory tier with room for ``count`` blocks and a disk tier, as kvmux builds them."""
    return {
        "memory": SlabWorker("memory", count + 8, 0, TierStats()),
        "disk": _disk_worker(directory, block_bytes, count),
    }


def _keys(count: int, salt: int) -> list[Any]:
    tokens = [(salt * 7919 + i) % 32000 for i in range(count * BLOCK)]
    return block_keys(NAMESPACE, tokens, BLOCK)


@contextlib.contextmanager
def _timed(run: Run) -> Iterator[list[float]]:
    run.sync()
    seconds: list[float] = []
    started = time.perf_counter()
    yield seconds
    run.sync()
    seconds.append(time.perf_counter() - started)


def _plain_copy_seconds(run: Run, nbytes: int) -> tuple[float, float]:
    """A plain copy of ``nbytes`` out to host memory and back (pinned on CUDA): the link."""
    source = torch.empty(nbytes, dtype=torch.uint8, device=run.device).random_(0, 256)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=run.cuda)
    best_out = best_in = float("inf")
    for _ in range(3):
        with _timed(run) as out:
            host.copy_(source, non_blocking=True)
        with _timed(run) as back:
            source.copy_(host, non_blocking=True)
        best_out, best_in = min(best_out, out[0]), min(best_in, back[0])
    return best_out, best_in


def _round_trip(run: Run, layout: str, dtype_name: str, directory: Path) -> None:
    """Layouts and sizes, then byte-exact round trips and throughput through each tier."""
    dtype = DTYPES[dtype_name]
    caches = _caches(run, layout, dtype)
    _, dim = _shape(layout, run.blocks)
    half = run.blocks // 2
    saved_ids, loaded_ids = list(range(half)), list(range(half, 2 * half))
    block_bytes = sum(t.select(dim, 0).numel() * t.element_size() for t in caches.values())
    per_token = block_bytes // BLOCK
    expected = (2 * HEADS * HEAD_DIM if layout != "mla" else LATENT) * LAYERS * dtype.itemsize
    size_row = Row("layout and size", layout, dtype_name, ok=per_token == expected)
    size_row.figures = {"bytes_per_token": per_token, "block_bytes": block_bytes}
    size_row.note = f"{per_token // 1024} KiB/token, {block_bytes / 2**20:.2f} MiB/block"
    workers = _workers(run, directory / f"{layout}-{dtype_name}", block_bytes, half)
    try:
        for worker in workers.values():
            worker.register(caches, run.blocks)
        run.add(size_row)
        out, back = _plain_copy_seconds(run, half * block_bytes)
        for salt, (name, worker) in enumerate(workers.items()):
            _tier_round_trip(
                run,
                name,
                worker,
                caches,
                dim,
                saved_ids,
                loaded_ids,
                salt,
                (layout, dtype_name, half * block_bytes, out, back),
            )
        if not run.cuda:  # the GPU path's logic at this size, with host stand-ins for streams
            _streamed_round_trip(run, layout, dtype_name, caches, dim, saved_ids, loaded_ids)
    finally:
        for worker in workers.values():
            worker.close()


def _streamed_round_trip(
    run: Run,
    layout: str,
    dtype_name: str,
    caches: dict[str, torch.Tensor],
    dim: int,
    saved_ids: list[int],
    loaded_ids: list[int],
) -> None:
    """HostSlab's and BlockMover's GPU code (staging, runs of slots, scatters) on the host."""
    want = _blocks_of(caches, dim, saved_ids)
    streams = RecordingStreams()
    slab = HostSlab([BlockMover(caches, run.blocks)], len(saved_ids), streams)
    slots = list(range(len(saved_ids)))
    slab.save(0, saved_ids, slots)
    _scramble(caches, dim, saved_ids)
    slab.load(0, loaded_ids, slots)
    via_slots = all(
        torch.equal(a, b) for a, b in zip(want, _blocks_of(caches, dim, loaded_ids), strict=False)
    )
    mover = BlockMover(caches, run.blocks, streams)
    entries = []
    for slot in slots:
        data = codec.encode(NAMESPACE, b"k" * 16, mover.layer_specs, slab.slot_parts(0, slot))
        entries.append(codec.decode(data, NAMESPACE, b"k" * 16))
    _scramble(caches, dim, loaded_ids)
    mover.copy_in_many(loaded_ids, entries)
    via_entries = all(
        torch.equal(a, b) for a, b in zip(want, _blocks_of(caches, dim, loaded_ids), strict=False)
    )
    host_waits = sum(e.host_waits for s in [streams.forward, *streams.streams] for e in s.recorded)
    ok = via_slots and via_entries and host_waits == 0
    run.add(
        Row(
            "GPU path on the host",
            layout,
            dtype_name,
            ok,
            {"slots_exact": via_slots, "entries_exact": via_entries, "host_waits": host_waits},
            note="staged slots and entries byte-exact, no host wait"
            if ok
            else f"slots exact {via_slots}, entries exact {via_entries}, host waits {host_waits}",
        )
    )


def _tier_round_trip(
    run: Run,
    tier: str,
    worker: WorkerBase,
    caches: dict[str, torch.Tensor],
    dim: int,
    saved_ids: list[int],
    loaded_ids: list[int],
    salt: int,
    what: tuple[str, str, int, float, float],
) -> None:
    layout, dtype_name, nbytes, plain_out, plain_in = what
    keys = _keys(len(saved_ids), salt)
    want = _blocks_of(caches, dim, saved_ids)
    with _timed(run) as save:
        worker.fence(TierStepPlan(step=1))
        worker.save(_plan(1, keys, saved_ids))
        worker.flush()
    _scramble(caches, dim, saved_ids)  # the saved blocks go to other requests
    with _timed(run) as load:
        worker.fence(TierStepPlan(step=2))
        worker.load([BlockTransfer(k, b) for k, b in zip(keys, loaded_ids, strict=False)])
    run.sync()
    got = _blocks_of(caches, dim, loaded_ids)
    exact = all(torch.equal(a, b) for a, b in zip(want, got, strict=False))
    errors = worker.take_load_errors()
    row = Row(f"round trip: {tier}", layout, dtype_name, ok=exact and not errors)
    save_gbs, load_gbs = nbytes / save[0] / 1e9, nbytes / load[0] / 1e9
    row.figures = {
        "bytes": nbytes,
        "save_GBps": save_gbs,
        "load_GBps": load_gbs,
        "plain_out_GBps": nbytes / plain_out / 1e9,
        "plain_in_GBps": nbytes / plain_in / 1e9,
        "byte_exact": exact,
        "load_errors": len(errors),
    }
    row.note = (
        f"{'byte-exact' if exact else 'BYTES DIFFER'}; save {save_gbs:.1f} GB/s, "
        f"load {load_gbs:.1f} GB/s; plain copy {nbytes / plain_out / 1e9:.1f} out, "
        f"{nbytes / plain_in / 1e9:.1f} in"
    )
    run.add(row)


def _hazards(run: Run, directory: Path) -> None:
    """Stream hazards on the GPU, widened with ``torch.cuda._sleep``."""
    if not run.cuda:
        run.add(Row("stream hazards", note="skipped: needs CUDA streams", skipped=True))
        return
    caches = _caches(run, "flash_attention", torch.bfloat16)
    dim = 1
    count = 8
    worker = SlabWorker("memory", 4 * count, 0, TierStats())
    worker.register(caches, run.blocks)
    try:
        _forward_writes_before_save(run, worker, caches, dim, count)
        _reuse_after_save(run, worker, caches, dim, count)
        _sync_debug(run, worker, "memory", caches, dim, count)
        _aborted_async_load(run, worker, caches, dim, count)
    finally:
        worker.close()
    _slot_reused_while_loading(run, caches, dim, count)
    disk = _disk_worker(directory / "sync-debug", 2 * 2**20, 4 * count)
    disk.register(caches, run.blocks)
    try:
        _sync_debug(run, disk, "disk", caches, dim, count)
    finally:
        disk.close()


def _spin(run: Run, stream: Any = None) -> None:
    """Keep ``stream`` (the current one by default) busy for about 50 ms."""
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        torch.cuda._sleep(int(1e8))  # type: ignore[no-untyped-call]  # cycles


def _filled(caches: Caches, dim: int, ids: list[int], value: int) -> None:
    """Write ``value`` into every byte of blocks ``ids`` (consecutive), on the current stream."""
    for tensor in caches.values():
        tensor.view(torch.uint8).narrow(dim, ids[0], len(ids)).fill_(value)


def _all_equal(blocks: list[torch.Tensor], value: int) -> bool:
    return all(bool((block == value).all()) for block in blocks)


def _transfers(keys: list[Any], ids: range | list[int]) -> list[BlockTransfer]:
    return [BlockTransfer(k, b) for k, b in zip(keys, ids, strict=True)]


def _forward_writes_before_save(
    run: Run, worker: SlabWorker, caches: Caches, dim: int, count: int
) -> None:
    """A save issued while the forward pass still writes its blocks saves what it wrote."""
    ids, keys, targets = list(range(count)), _keys(count, 11), list(range(count, 2 * count))
    _filled(caches, dim, ids, 0x3C)
    run.sync()
    _spin(run)  # the forward pass is still running ...
    _filled(caches, dim, ids, 0xA5)  # ... and writes these blocks when it gets there
    worker.fence(TierStepPlan(step=1))
    worker.save(_plan(1, keys, ids))  # returns while the forward stream still sleeps
    worker.fence(TierStepPlan(step=2, fence=1))  # the next step reuses the blocks
    _scramble(caches, dim, ids)
    worker.load(_transfers(keys, targets))
    run.sync()
    ok = _all_equal(_blocks_of(caches, dim, targets), 0xA5)
    note = "a save sees the forward pass's writes" if ok else "saved bytes from before the writes"
    run.add(Row("hazard: forward writes", "flash_attention", "bf16", ok, note=note))


def _reuse_after_save(run: Run, worker: SlabWorker, caches: Caches, dim: int, count: int) -> None:
    """A block saved, then rewritten in the next step, keeps the saved bytes in its slot."""
    ids, keys, targets = list(range(count)), _keys(count, 12), list(range(2 * count, 3 * count))
    slab = worker._slab
    assert slab is not None and slab._save_stream is not None
    _filled(caches, dim, ids, 0x6E)
    _spin(run, slab._save_stream)  # the save's copies run late ...
    worker.save(_plan(2, keys, ids))
    worker.fence(TierStepPlan(step=3, fence=2))  # ... and step 3 reuses the blocks
    _scramble(caches, dim, ids)  # the next request's forward pass writes them
    worker.load(_transfers(keys, targets))
    run.sync()
    ok = _all_equal(_blocks_of(caches, dim, targets), 0x6E)
    note = "saved bytes kept after the block was rewritten" if ok else "slot overwritten"
    run.add(Row("hazard: block reuse", "flash_attention", "bf16", ok, note=note))


def _slot_reused_while_loading(run: Run, caches: Caches, dim: int, count: int) -> None:
    """A save into a slot that a load on another stream still reads waits for that load."""
    slab = HostSlab([BlockMover(caches, run.blocks)], count)
    ids, targets, slots = list(range(count)), list(range(count, 2 * count)), list(range(count))
    _filled(caches, dim, ids, 0x11)
    first = slab.save(0, ids, slots)
    assert first is not None
    first.order([torch.cuda.current_stream(run.device)])  # the fence before the next writes
    loader = torch.cuda.Stream(run.device)  # type: ignore[no-untyped-call]
    _spin(run, loader)  # the load runs late on its stream ...
    with torch.cuda.stream(loader):
        slab.load(0, targets, slots)
    _filled(caches, dim, ids, 0x22)
    slab.save(0, ids, slots)  # ... while a save reuses its slots
    run.sync()
    ok = _all_equal(_blocks_of(caches, dim, targets), 0x11)
    note = (
        "the load read the slots before the save reused them" if ok else "the load read new bytes"
    )
    run.add(Row("hazard: slot reuse", "flash_attention", "bf16", ok, note=note))


@contextlib.contextmanager
def _no_host_waits(errors: list[str], name: str) -> Iterator[None]:
    """``set_sync_debug_mode("error")``, and event and stream waits on this thread refused
    (torch's debug mode does not see ``cudaEventSynchronize``)."""
    main = threading.current_thread()
    real = {cls: cls.synchronize for cls in (torch.cuda.Event, torch.cuda.Stream)}

    def refuse(cls: Any) -> Callable[..., Any]:
        def synchronize(self: Any) -> Any:
            if threading.current_thread() is main:
                raise RuntimeError(f"{cls.__name__}.synchronize() on the forward path")
            return real[cls](self)

        return synchronize

    for cls in real:
        cls.synchronize = refuse(cls)  # type: ignore[method-assign]
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    except RuntimeError as exc:
        errors.append(f"{name}: {exc}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
        for cls, method in real.items():
            cls.synchronize = method  # type: ignore[method-assign]


def _errors_of(worker: WorkerBase) -> tuple[float, ...]:
    stats = worker._stats
    return (stats.save_errors, stats.store_errors, stats.load_errors)


def _sync_debug(
    run: Run, worker: WorkerBase, tier: str, caches: Caches, dim: int, count: int
) -> None:
    """No host synchronisation in any call the forward path makes, on the engine thread."""
    ids, keys = list(range(count)), _keys(count, 13)
    gate = threading.Event()
    loader = worker._loader
    real = loader._load_blocks

    def gated(transfers: Any) -> list[bool]:
        gate.wait()  # the loader's copies (and its own wait) start after the window
        return real(transfers)

    loader._load_blocks = gated
    targets = [list(range(k * count, (k + 1) * count)) for k in (1, 2)]
    load = RequestLoad("debug", 0, tuple((t,) for t in _transfers(keys, targets[1])))
    before = _errors_of(worker)
    errors: list[str] = []
    with _no_host_waits(errors, "bind"):
        worker.fence(TierStepPlan(step=5, fence=4))
    with _no_host_waits(errors, "save"):
        worker.save(_plan(4, keys, ids))
    worker.flush()  # the host waits here on purpose: a tier's writer, not the forward path
    with _no_host_waits(errors, "bind after save"):
        worker.fence(TierStepPlan(step=6, fence=5))
    with _no_host_waits(errors, "sync load"):
        worker.load(_transfers(keys, targets[0]))
    with _no_host_waits(errors, "async load start"):
        worker.start_loads([load])
    gate.set()
    report = _finish_load(worker, "debug")
    loader._load_blocks = real
    run.sync()
    if worker.take_load_errors() or report.failed or _errors_of(worker) != before:
        errors.append(f"errors counted: {_errors_of(worker)} after {before}, {report.failed}")
    note = "; ".join(errors) or "bind, save, sync load, async load start"
    run.add(Row(f"no host sync: {tier}", "flash_attention", "bf16", not errors, note=note))


def _finish_load(worker: WorkerBase, req_id: str, cancel: bool = False) -> Any:
    """Wait for ``req_id``'s load to be reported (cancelling it first if ``cancel``)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = worker.finished_loads({req_id} if cancel else (), idle=True)
        if req_id in done.finished:
            return done
    raise RuntimeError(f"the load of {req_id} never ended")


def _aborted_async_load(run: Run, worker: SlabWorker, caches: Caches, dim: int, count: int) -> None:
    """A load aborted once its first copies are submitted (running late) writes nothing
    into its blocks after it is reported: vLLM then hands them to another request."""
    keys = _keys(count, 13)  # saved by the sync-debug check
    targets = list(range(3 * count, 4 * count))
    copies, loader = worker._copies, worker._loader
    assert copies is not None and copies._stream is not None
    submitted, real = threading.Event(), loader._load_blocks

    def signalled(transfers: Any) -> list[bool]:
        landed = real(transfers)
        submitted.set()  # this batch's copies are queued behind the spin
        return landed

    loader._load_blocks = signalled
    loader._batch_size = 2  # four batches: the abort stops the rest
    loaded_before = worker._stats.loaded_blocks
    _spin(run, copies._stream)  # the loader's copies run late
    worker.start_loads([RequestLoad("aborted", 0, tuple((t,) for t in _transfers(keys, targets)))])
    submitted.wait(10)
    _finish_load(worker, "aborted", cancel=True)  # the engine aborts it, frees its blocks ...
    loader._load_blocks = real
    _filled(caches, dim, targets, 0x5A)  # ... and another request's forward pass writes them
    run.sync()
    time.sleep(0.2)
    run.sync()
    copied = worker._stats.loaded_blocks - loaded_before
    ok = _all_equal(_blocks_of(caches, dim, targets), 0x5A) and copied > 0
    note = (
        f"{copied:.0f} of {count} blocks copied before the abort; nothing written after"
        if ok
        else f"{copied:.0f} blocks copied; late writes or no copy issued"
    )
    run.add(Row("hazard: aborted load", "flash_attention", "bf16", ok, note=note))


def _slowdown(run: Run) -> None:
    """The forward stream's compute, timed alone and while saves run beside it."""
    if not run.cuda:
        run.add(Row("forward slowdown", note="skipped: needs CUDA streams", skipped=True))
        return
    caches = _caches(run, "flash_attention", torch.bfloat16)
    worker = SlabWorker("memory", run.blocks, 0, TierStats())
    worker.register(caches, run.blocks)
    a = torch.randn(4096, 4096, device=run.device, dtype=torch.bfloat16)

    def compute() -> float:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(50):
            a @ a
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    compute()
    alone = min(compute() for _ in range(3))
    ids = list(range(run.blocks // 2))
    beside = []
    for step in range(3):
        worker.save(_plan(10 + step, _keys(len(ids), 20 + step), ids))
        beside.append(compute())
    worker.flush()
    worker.close()
    ratio = min(beside) / alone
    run.add(
        Row(
            "forward slowdown",
            "flash_attention",
            "bf16",
            True,
            {"alone_ms": alone, "with_saves_ms": min(beside), "ratio": ratio},
            note=f"{alone:.1f} ms alone, {min(beside):.1f} ms beside saves (x{ratio:.2f})",
        )
    )


def _resident_bytes() -> int:
    """This process's resident memory (pinned pages are always resident)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _pinned(run: Run, directory: Path) -> None:
    """Host memory the tiers take (pinned on a GPU), against their capacity and save queue."""
    caches = _caches(run, "flash_attention", torch.bfloat16)
    count = run.blocks // 2
    before = _resident_bytes()
    memory = SlabWorker("memory", count, 0, TierStats())
    memory.register(caches, run.blocks)
    disk = StoreWorker(DiskStore(directory / "pinned", 1 << 30), NAMESPACE, 0, TierStats())
    disk.register(caches, run.blocks)
    grown = _resident_bytes() - before
    slab, staging = memory._slab, disk._staging
    assert slab is not None
    capacity, queue = slab.slots * slab.slot_bytes, disk._save_queue
    pinned = slab.pinned_bytes + (staging.pinned_bytes if staging is not None else 0)
    figures: dict[str, Any] = {
        "memory_capacity": capacity,
        "save_queue": queue,
        "pinned": pinned,
        "resident_growth": grown,
    }
    slack = 128 * 2**20
    ok = grown <= capacity + queue + slack and (pinned == 0 or pinned <= capacity + queue)
    note = (
        f"{grown / GiB:.2f} GiB more resident ({pinned / GiB:.2f} GiB pinned) for "
        f"{capacity / GiB:.2f} GiB of slots and a {queue / GiB:.2f} GiB save queue"
    )
    run.add(Row("host memory", "flash_attention", "bf16", ok, figures, note=note))
    memory.close()
    disk.close()


def _blocks_heads(blocks: int) -> tuple[int, ...]:
    return (blocks, HEADS, BLOCK, 2 * HEAD_DIM)  # vLLM 0.32+: [blocks, heads, tokens, K|V]


def _flash_attention(blocks: int) -> tuple[int, ...]:
    return (2, blocks, BLOCK, HEADS, HEAD_DIM)


SHARD_LAYOUTS = {  # one layer's cache at TP=1, its block dimension and its head dimension
    "blocks_heads": (_blocks_heads, 0, 1),
    "flash_attention": (_flash_attention, 1, 3),
}


def _shard_round_trip(run: Run, directory: Path) -> None:
    """Entries shared across TP sizes on the device: two TP=2 ranks save their heads of
    every block (narrowed views), a TP=1 cache loads them whole, each over its own store
    on one folder, as the ranks of two engines."""
    count = 16
    ids, targets = list(range(1, count + 1)), list(range(count + 1, 2 * count + 1))
    for layout, (shape, dim, axis) in SHARD_LAYOUTS.items():
        full = {}
        for layer in range(LAYERS):
            raw = torch.empty(shape(run.blocks), dtype=torch.bfloat16, device=run.device)
            full[f"model.layers.{layer}.self_attn"] = (
                raw.view(torch.uint8).random_(0, 256).view(torch.bfloat16)
            )
        want = _blocks_of(full, dim, ids)
        queue = 2 * sum(b.numel() for b in want)  # every save fits, a small pinned slab
        keys = _keys(count, salt=7 + len(layout))
        folder = directory / f"shards-{layout}"
        for rank in range(2):
            shards = block_shards(HEADS, 2, rank)
            half = HEADS // 2
            caches = {n: t.narrow(axis, rank * half, half).clone() for n, t in full.items()}
            store = DiskStore(folder, capacity=1 << 34)
            worker = StoreWorker(store, NAMESPACE, rank, TierStats(), queue, shards=shards)
            worker.register(caches, run.blocks)
            worker.save(_plan(1, keys, ids))
            worker.close()  # every save written
        loaded = {n: torch.zeros_like(t) for n, t in full.items()}
        store = DiskStore(folder, capacity=1 << 34)
        loader = StoreWorker(store, NAMESPACE, 0, TierStats(), queue, shards=block_shards(HEADS))
        loader.register(loaded, run.blocks)
        loader.load([BlockTransfer(k, b) for k, b in zip(keys, targets, strict=True)])
        run.sync()
        got = _blocks_of(loaded, dim, targets)
        exact = all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
        errors = loader.take_load_errors()
        loader.close()
        note = f"TP=2 saves, TP=1 loads: {'byte-exact' if exact else 'BYTES DIFFER'}"
        run.add(Row("shards across TP", layout, "bf16", exact and not errors, note=note))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--blocks", type=int, default=0, help="KV cache blocks per layer")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    run = Run(device, args.blocks or (256 if args.device == "cuda" else 64))
    name = torch.cuda.get_device_name(device) if run.cuda else "cpu"
    print(f"kvmux gpu_check --quick on {name}, torch {torch.__version__}, {run.blocks} blocks")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvmux-gpu-check-") as tmp:
        directory = Path(tmp)
        for layout in LAYOUTS:
            for dtype in DTYPES:
                _round_trip(run, layout, dtype, directory)
        _hazards(run, directory)
        _slowdown(run)
        _pinned(run, directory)
        _shard_round_trip(run, directory)
    seconds = time.perf_counter() - started
    assert "vllm" not in sys.modules
    failed = [row for row in run.rows if not row.ok]
    _table(run, name)
    report = {
        "device": name,
        "torch": torch.__version__,
        "seconds": seconds,
        "passed": not failed,
        "rows": [asdict(row) for row in run.rows],
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(
        f"kvmux gpu_check --quick: {len(run.rows) - len(failed)} of {len(run.rows)} passed "
        f"in {seconds:.0f} s on {name}"
    )
    return 1 if failed else 0


def _result(row: Row) -> str:
    return "skipped" if row.skipped else "ok" if row.ok else "FAIL"


def _table(run: Run, name: str) -> None:
    print(f"\n| check | layout | dtype | result | details |  ({name})")
    print("|---|---|---|---|---|")
    for row in run.rows:
        print(f"| {row.check} | {row.layout} | {row.dtype} | {_result(row)} | {row.note} |")


if __name__ == "__main__":
    os.environ.setdefault("KVMUX_LOG_LEVEL", "WARNING")
    sys.exit(main())
