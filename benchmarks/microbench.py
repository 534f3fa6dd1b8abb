"""Store microbenchmarks: kvmux put/get on each tier against a raw limit measured alongside."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.redis_proc import RedisProcess
from kvmux.codec import DecodedEntry
from kvmux.config import RedisSpec
from kvmux.keys import BlockKey
from kvmux.metrics import TierStats
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan
from kvmux.tier.worker.slab_worker import SlabWorker
from kvmux.tier.worker.transfer import BlockMover
from kvmux.tools.tier_bench import (
    BATCH,
    LAYERS,
    REPEATS,
    WARM_DISK,
    Entries,
    Timed,
    Unit,
    check_sizes,
    disk_rows,
    redis_rows,
    row,
)

__all__ = ["REPEATS", "WARM_DISK", "run_store_bench"]


class TensorLayers:
    """The layers as bf16 tensors, one per layer; a load copies an entry into a paged cache."""

    def __init__(self, entries: int, entry_bytes: int):
        layer_bytes = entry_bytes // LAYERS
        generator = torch.Generator().manual_seed(0)
        raw = torch.randint(
            0, 256, (LAYERS, entries, layer_bytes), dtype=torch.uint8, generator=generator
        )
        self.source = [raw[layer].view(torch.bfloat16) for layer in range(LAYERS)]
        self.payloads = raw.permute(1, 0, 2).reshape(entries, entry_bytes)  # entry i's bytes
        dest = {f"layer.{n}": torch.zeros_like(t) for n, t in enumerate(self.source)}
        self.mover = BlockMover(dest, num_blocks=entries)

    def parts(self, i: int) -> list[memoryview]:
        """Entry ``i``'s layers: block ``i`` of each source tensor, not copied."""
        return BlockMover.block_parts(self.source, i)

    def copy_in(self, i: int, entry: DecodedEntry) -> None:
        """Copy a verified entry into block ``i`` of the destination cache."""
        self.mover.copy_in(i, entry)


class _Bench(Entries):
    """One run's blocks: tensor layers, their encoded entries, a tqdm bar per measurement."""

    def __init__(self, entries: int, entry_bytes: int, progress: bool):
        check_sizes(entries, entry_bytes)  # before the tensors are cut to those sizes
        self.tensors = TensorLayers(entries, entry_bytes)
        self.bar: tqdm[Any] | None = None
        super().__init__(entries, entry_bytes, self.tensors, progress=self._advance)
        self.show = progress

    def _advance(self, desc: str, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done)

    def measure(self, desc: str, *ops: Timed) -> list[dict[str, float]]:
        """``Entries.measure`` under a progress bar.

        Taking turns puts kvmux's operations and their limits in the same spells of the
        machine, so a slow spell weighs on both sides of a ratio rather than on one.
        """
        total = REPEATS * sum(len(unit) for op in ops for unit in op.units)
        with tqdm(total=total, desc=desc, unit="entry", disable=not self.show) as self.bar:
            return super().measure(desc, *ops)


def _memory(b: _Bench) -> list[dict[str, Any]]:
    """The memory tier's worker: a step's blocks into its slots and back, as in the engine.

    The KV cache is the source layers (group 0) and a second group of identical layers
    the blocks are loaded into; block ids are shuffled, as in a paged cache.
    """
    source = b.tensors.source
    caches = {f"src.{n}": t for n, t in enumerate(source)}
    caches.update({f"dst.{n}": torch.zeros_like(t) for n, t in enumerate(source)})
    groups = [[f"src.{n}" for n in range(LAYERS)], [f"dst.{n}" for n in range(LAYERS)]]
    worker = SlabWorker("memory", b.count, 0, TierStats())
    worker.register(caches, b.count, groups)
    order = torch.randperm(b.count, generator=torch.Generator().manual_seed(1)).tolist()
    keys = [BlockKey(key) for key in b.keys]

    def put(unit: Unit) -> None:
        worker.save(TierStepPlan(saves=[BlockTransfer(keys[i], order[i], 0) for i in unit]))

    def get(unit: Unit) -> None:
        worker.load([BlockTransfer(keys[i], order[-1 - i], 1) for i in unit])
        if worker.take_load_errors():
            raise RuntimeError("an entry went missing during the benchmark")

    flat = b.tensors.payloads.reshape(-1)
    dst = torch.empty_like(flat)

    def copy(unit: Unit) -> None:
        start, end = unit[0] * b.entry_bytes, (unit[-1] + 1) * b.entry_bytes
        dst[start:end].copy_(flat[start:end])

    saved, loaded, limit = b.measure(
        "memory",
        Timed(b.batches, put, worker.clear),
        Timed(b.batches, get),
        Timed(b.batches, copy),
    )
    worker.close()
    name = f"tensor copy of a step's {BATCH} blocks (dst.copy_(src), contiguous)"
    return [row("memory", "put", saved, name, limit), row("memory", "get", loaded, name, limit)]


def _redis(b: _Bench, workdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Redis put and get against pipelined SET and GET, on a server of the run's own."""
    maxmemory = max(4 * 10**9, 3 * b.count * (b.entry_bytes + 4096))
    with RedisProcess(workdir / "redis", maxmemory) as server:
        spec = RedisSpec(url=server.url, key_prefix="bench:", socket_timeout=30.0)
        rows, info = redis_rows(b, spec)
    return rows, {**info, "maxmemory_policy": server.maxmemory_policy, "persistence": "off"}


def run_store_bench(
    entries: int, entry_bytes: int, workdir: Path, progress: bool = True
) -> dict[str, Any]:
    """Measure kvmux put/get on the memory, disk and redis tiers against raw limits."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    bench = _Bench(entries, entry_bytes, progress)
    with warnings.catch_warnings():  # torch.frombuffer on read-only bytes, as in a real load
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        memory = _memory(bench)
        disk, page_cache = disk_rows(bench, workdir / "disk")
        redis, redis_info = _redis(bench, workdir)
    return {
        "config": {
            "entries": entries,
            "entry_bytes": entry_bytes,
            "encoded_entry_bytes": len(bench.values[0]),
            "layers": LAYERS,
            "layer_bytes": entry_bytes // LAYERS,
            "layer_dtype": "bfloat16",
            "repeats": REPEATS,
            "keep": f"best of {REPEATS} repeats (lowest total time)",
            "order": "a tier's operations and their limits take turns, repeat by repeat",
            "gb": "1e9 bytes of payload (entries x entry_bytes)",
            "seconds": "sum of the timed calls (time.perf_counter)",
            "latency": f"per entry; memory and redis: time of a step of {BATCH} / entries in it",
            "torch_threads": torch.get_num_threads(),
        },
        "rows": memory + disk + redis,
        "disk_page_cache": page_cache,
        "redis": redis_info,
    }
