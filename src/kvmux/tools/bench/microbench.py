"""Store microbenchmarks: kvmux put/get on each tier against a raw limit measured alongside."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from kvmux import codec
from kvmux.codec import LayerSpec
from kvmux.config import RedisSpec
from kvmux.keys import BlockKey, namespace_id
from kvmux.metrics import TierStats
from kvmux.stores.base import KVStore, ValueParts
from kvmux.stores.disk import DiskStore
from kvmux.stores.redis import RedisStore
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan
from kvmux.tier.worker.slab_worker import SlabWorker
from kvmux.tier.worker.transfer import BlockMover
from kvmux.tools.bench.page_cache import CAN_EVICT, evict_page_cache, page_cache_state
from kvmux.tools.bench.redis_proc import RedisProcess

__all__ = ["WARM_DISK", "run_store_bench"]

LAYERS = 8  # layers per entry, as in one block of the benchmark model
BATCH = 8  # redis entries per pipelined round trip (one engine step)
REPEATS = 5  # rounds in which a tier's operations take turns; each keeps its fastest
NAMESPACE = namespace_id({"bench": "stores"})
WARM_DISK = "disk, page cache warm"  # the disk get row read right after the cold one

Unit = list[int]  # indices of the entries one timed call handles
Samples = list[tuple[float, int]]  # (seconds, entries) of each timed call


@dataclass(frozen=True)
class _Timed:
    """One timed operation: ``body`` on every unit, after ``before`` (untimed)."""

    units: list[Unit]
    body: Callable[[Unit], object]
    before: Callable[[], object] | None = None

    def run(self) -> Samples:
        """Time one pass over every unit."""
        if self.before is not None:
            self.before()
        samples: Samples = []
        for unit in self.units:
            start = time.perf_counter()
            self.body(unit)
            samples.append((time.perf_counter() - start, len(unit)))
        return samples


def _percentile(ordered: Sequence[float], q: float) -> float:
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _summary(samples: Samples, entry_bytes: int) -> dict[str, float]:
    seconds = _total(samples)
    count = sum(n for _, n in samples)
    per_entry = sorted(1e3 * s / n for s, n in samples)
    return {
        "gbps": count * entry_bytes / seconds / 1e9,
        "seconds": seconds,
        "lat_mean_ms": 1e3 * seconds / count,
        "lat_p50_ms": _percentile(per_entry, 50),
        "lat_p90_ms": _percentile(per_entry, 90),
    }


def _row(
    tier: str, op: str, kvmux: dict[str, float], limit: str, raw: dict[str, float]
) -> dict[str, Any]:
    row: dict[str, Any] = {"tier": tier, "op": op}
    row.update({f"kvmux_{name}": value for name, value in kvmux.items()})
    row["limit"] = limit
    row.update({f"limit_{name}": value for name, value in raw.items()})
    row["ratio"] = kvmux["gbps"] / raw["gbps"]
    return row


def _write_file(path: Path, value: bytes) -> None:
    with open(path, "xb") as handle:  # always a new file
        handle.write(value)


def _check_stored(stored: list[bool]) -> None:
    if not all(stored):
        raise RuntimeError("the store refused a write during the benchmark")


class _Bench:
    """One run's blocks: the source layers, their encoded entries and a destination cache."""

    def __init__(self, entries: int, entry_bytes: int, progress: bool):
        if entries < 1 or entry_bytes < 2 * LAYERS or entry_bytes % (2 * LAYERS):
            raise ValueError(f"entry_bytes must be a positive multiple of {2 * LAYERS}")
        self.entries, self.entry_bytes, self.progress = entries, entry_bytes, progress
        layer_bytes = entry_bytes // LAYERS
        self.specs = tuple(LayerSpec((layer_bytes // 2,), "bfloat16") for _ in range(LAYERS))
        generator = torch.Generator().manual_seed(0)
        raw = torch.randint(
            0, 256, (LAYERS, entries, layer_bytes), dtype=torch.uint8, generator=generator
        )
        self.source = [raw[layer].view(torch.bfloat16) for layer in range(LAYERS)]
        self.payloads = raw.permute(1, 0, 2).reshape(entries, entry_bytes)  # entry i's bytes
        self.keys = [i.to_bytes(16, "big") for i in range(entries)]
        self.values = [self.encode(i) for i in range(entries)]  # what the limits move
        dest = {f"layer.{n}": torch.zeros_like(t) for n, t in enumerate(self.source)}
        self.mover = BlockMover(dest, num_blocks=entries)
        self.singles = [[i] for i in range(entries)]
        self.batches = [list(range(i, min(i + BATCH, entries))) for i in range(0, entries, BATCH)]

    def encode(self, i: int) -> bytes:
        """Entry ``i`` encoded from the source layers, in one piece."""
        return b"".join(self.encode_parts(i))

    def encode_parts(self, i: int) -> ValueParts:
        """Entry ``i`` encoded from the source layers as the pieces a save writes."""
        parts = BlockMover.block_parts(self.source, i)
        return codec.encode_parts(NAMESPACE, self.keys[i], self.specs, parts)

    def put(self, store: KVStore, unit: Unit) -> None:
        """Encode and write the unit's entries, as a tier's writer does."""
        items = [(self.keys[i], self.encode_parts(i)) for i in unit]
        _check_stored(store.put_many_parts(items))

    def load(self, i: int, value: bytes | None) -> None:
        """Verify entry ``i`` and copy its layers into the destination, as a load does."""
        if value is None:
            raise RuntimeError(f"entry {i} missing during the benchmark")
        self.mover.copy_in(i, codec.decode(value, NAMESPACE, self.keys[i]))

    def measure(self, desc: str, *ops: _Timed) -> list[dict[str, float]]:
        """Time ``ops`` in turn, REPEATS rounds; the summary of each one's fastest round.

        Taking turns puts kvmux's operations and their limits in the same spells of the
        machine, so a slow spell weighs on both sides of a ratio rather than on one.
        """
        best: list[Samples | None] = [None] * len(ops)
        total = REPEATS * sum(len(unit) for op in ops for unit in op.units)
        with tqdm(total=total, desc=desc, unit="entry", disable=not self.progress) as bar:
            for _ in range(REPEATS):
                for n, op in enumerate(ops):
                    samples = op.run()
                    bar.update(sum(count for _, count in samples))
                    fastest = best[n]
                    if fastest is None or _total(samples) < _total(fastest):
                        best[n] = samples
        return [_summary(samples, self.entry_bytes) for samples in best if samples is not None]


def _total(samples: Samples) -> float:
    return sum(seconds for seconds, _ in samples)


def _memory(b: _Bench) -> list[dict[str, Any]]:
    """The memory tier's worker: a step's blocks into its slots and back, as in the engine.

    The KV cache is the source layers (group 0) and a second group of identical layers
    the blocks are loaded into; block ids are shuffled, as in a paged cache.
    """
    caches = {f"src.{n}": t for n, t in enumerate(b.source)}
    caches.update({f"dst.{n}": torch.zeros_like(t) for n, t in enumerate(b.source)})
    groups = [[f"src.{n}" for n in range(LAYERS)], [f"dst.{n}" for n in range(LAYERS)]]
    worker = SlabWorker("memory", b.entries, 0, TierStats())
    worker.register(caches, b.entries, groups)
    order = torch.randperm(b.entries, generator=torch.Generator().manual_seed(1)).tolist()
    keys = [BlockKey(key) for key in b.keys]

    def put(unit: Unit) -> None:
        worker.save(TierStepPlan(saves=[BlockTransfer(keys[i], order[i], 0) for i in unit]))

    def get(unit: Unit) -> None:
        worker.load([BlockTransfer(keys[i], order[-1 - i], 1) for i in unit])
        if worker.take_load_errors():
            raise RuntimeError("an entry went missing during the benchmark")

    flat = b.payloads.reshape(-1)
    dst = torch.empty_like(flat)

    def copy(unit: Unit) -> None:
        start, end = unit[0] * b.entry_bytes, (unit[-1] + 1) * b.entry_bytes
        dst[start:end].copy_(flat[start:end])

    saved, loaded, limit = b.measure(
        "memory",
        _Timed(b.batches, put, worker.clear),
        _Timed(b.batches, get),
        _Timed(b.batches, copy),
    )
    worker.close()
    name = f"tensor copy of a step's {BATCH} blocks (dst.copy_(src), contiguous)"
    return [_row("memory", "put", saved, name, limit), _row("memory", "get", loaded, name, limit)]


def _disk(b: _Bench, root: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Disk put and write, cold get and read (files evicted first), warm get and read."""
    store_dir = root / "kvmux"
    store = DiskStore(store_dir, capacity=4 * b.entries * (b.entry_bytes + 4096))
    raw_dir = root / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    paths = [raw_dir / f"{i}.bin" for i in range(b.entries)]
    evicted: list[int] = []

    def cold(directory: Path) -> None:
        evicted.append(evict_page_cache(directory))

    def fresh_store() -> None:
        store.clear()
        os.sync()

    def fresh_files() -> None:
        for path in paths:
            path.unlink(missing_ok=True)
        os.sync()

    def get(unit: Unit) -> None:
        b.load(unit[0], store.get(b.keys[unit[0]]))

    def read(unit: Unit) -> None:
        paths[unit[0]].read_bytes()

    # the warm passes come right after the cold ones, which read their files into the cache
    put, write, cold_get, cold_read, warm_get, warm_read = b.measure(
        "disk",
        _Timed(b.singles, partial(b.put, store), fresh_store),
        _Timed(b.singles, lambda u: _write_file(paths[u[0]], b.values[u[0]]), fresh_files),
        _Timed(b.singles, get, partial(cold, store_dir)),
        _Timed(b.singles, read, partial(cold, raw_dir)),
        _Timed(b.singles, get),
        _Timed(b.singles, read),
    )
    shutil.rmtree(root, ignore_errors=True)
    reads = "evicted" if CAN_EVICT else "not evicted"
    cache = {
        "reads": reads,
        "cold": f"the pass's files {page_cache_state(min(evicted, default=0))} before every "
        "cold read pass, each written back (fdatasync) first",
        "warm": f"{WARM_DISK}: the same reads right after the cold pass, nothing evicted",
        "writes": "not fsynced (DiskStore does not fsync either): writes land in the page cache",
    }
    how = "sequential read (open/read/close)"
    rows = [
        _row("disk", "put", put, "sequential write (open/write/close, new file)", write),
        {**_row("disk", "get", cold_get, how, cold_read), "page_cache": reads},
        {**_row(WARM_DISK, "get", warm_get, how, warm_read), "page_cache": "warm"},
    ]
    return rows, cache


def _redis(b: _Bench, workdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import redis

    maxmemory = max(4 * 10**9, 3 * b.entries * (b.entry_bytes + 4096))
    raw_keys = [b"raw:" + key for key in b.keys]

    def get_batch(unit: Unit) -> None:
        for i, value in zip(unit, store.get_many([b.keys[i] for i in unit]), strict=True):
            b.load(i, value)

    def raw_set_batch(unit: Unit) -> None:
        pipe = plain.pipeline(transaction=False)
        for i in unit:
            pipe.set(raw_keys[i], b.values[i])
        _check_stored([bool(reply) for reply in pipe.execute()])

    def raw_get_batch(unit: Unit) -> None:
        pipe = plain.pipeline(transaction=False)
        for i in unit:
            pipe.get(raw_keys[i])
        if any(value is None for value in pipe.execute()):
            raise RuntimeError("raw value missing during the benchmark")

    with RedisProcess(workdir / "redis", maxmemory) as server:
        spec = RedisSpec(url=server.url, key_prefix="bench:", socket_timeout=30.0)
        store = RedisStore(spec)
        plain = redis.Redis.from_url(server.url, socket_timeout=30.0)
        try:
            put, get, raw_set, raw_get = b.measure(
                "redis",
                _Timed(b.batches, partial(b.put, store), plain.flushall),
                _Timed(b.batches, get_batch),
                _Timed(b.batches, raw_set_batch, plain.flushall),
                _Timed(b.batches, raw_get_batch),
            )
            version = str(plain.info("server")["redis_version"])
        finally:
            store.close()
            plain.close()
    how = f"redis-py pipeline(transaction=False), {BATCH} per round trip"
    rows = [
        _row("redis", "put", put, f"pipelined SET ({how})", raw_set),
        _row("redis", "get", get, f"pipelined GET ({how})", raw_get),
    ]
    info = {
        "version": version,
        "maxmemory": maxmemory,
        "maxmemory_policy": server.maxmemory_policy,
        "persistence": "off",
        "batch": BATCH,
    }
    return rows, info


def run_store_bench(
    entries: int, entry_bytes: int, workdir: Path, progress: bool = True
) -> dict[str, Any]:
    """Measure kvmux put/get on the memory, disk and redis tiers against raw limits."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    bench = _Bench(entries, entry_bytes, progress)
    with warnings.catch_warnings():  # torch.frombuffer on read-only bytes, as in a real load
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        rows = _memory(bench)
        disk_rows, page_cache = _disk(bench, workdir / "disk")
        redis_rows, redis_info = _redis(bench, workdir)
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
        "rows": rows + disk_rows + redis_rows,
        "disk_page_cache": page_cache,
        "redis": redis_info,
    }
