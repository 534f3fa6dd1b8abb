"""``kvmux bench tier``: a disk or Redis tier's put and get beside the raw limit of its device.

kvmux's put encodes each entry (``kvmux.codec``, signed where the tier signs) and writes it
as a tier's writer does; its get reads it back, verifies it and copies its payload out, as
a load does. Beside each, the limit moves the same encoded bytes with nothing of kvmux: a
plain file write and read on the same file system (cold reads: the files are evicted from
the page cache first, ``page_cache``), or pipelined SET and GET on the same server. The
operations take turns, round by round, and each keeps its fastest round, so a slow spell
of the machine weighs on both sides of a ratio. A tier's own entries are left alone: a disk
run works in a new directory under the path it is given, a Redis run under a key prefix
of its own, and both are removed afterwards. Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from kvmux import codec
from kvmux.codec import DecodedEntry, LayerSpec, SigningKeys
from kvmux.config import DiskSpec, MemorySpec, RedisSpec, StoreSpec
from kvmux.errors import ConfigError, StoreUnavailable
from kvmux.keys import namespace_id
from kvmux.stores.base import KVStore, ValueParts
from kvmux.stores.disk import DiskStore
from kvmux.tools.page_cache import CAN_EVICT, evict_page_cache, page_cache_state

__all__ = [
    "BATCH",
    "LAYERS",
    "REPEATS",
    "WARM_DISK",
    "Entries",
    "HostLayers",
    "Timed",
    "bench_tier",
    "check_sizes",
    "disk_rows",
    "format_rows",
    "redis_rows",
    "row",
]

LAYERS = 8  # layers per entry, as in one block of a small model
BATCH = 8  # redis entries per pipelined round trip (one engine step)
REPEATS = 5  # rounds in which a tier's operations take turns; each keeps its fastest
NAMESPACE = namespace_id({"bench": "stores"})
WARM_DISK = "disk, page cache warm"  # the disk get row read right after the cold one

Unit = list[int]  # indices of the entries one timed call handles
Samples = list[tuple[float, int]]  # (seconds, entries) of each timed call
Progress = Callable[[str, int], None]  # (operation group, entries just done)


@dataclass(frozen=True)
class Timed:
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


class Layers(Protocol):
    """Where the entries' layers come from, and where a load puts them."""

    def parts(self, i: int) -> Sequence[memoryview | bytes]:
        """Entry ``i``'s layers, as raw bytes in order."""

    def copy_in(self, i: int, entry: DecodedEntry) -> None:
        """Put verified entry ``i`` where a load would."""


class HostLayers:
    """Random layer bytes in host memory; a load copies the payload into a host buffer."""

    def __init__(self, entries: int, entry_bytes: int):
        self.entry_bytes, self.layer_bytes = entry_bytes, entry_bytes // LAYERS
        self.source = memoryview(random.Random(0).randbytes(entries * entry_bytes))
        self.dest = memoryview(bytearray(entries * entry_bytes))

    def parts(self, i: int) -> Sequence[memoryview | bytes]:
        """Entry ``i``'s layers: slices of the source, not copies."""
        base = i * self.entry_bytes
        size = self.layer_bytes
        return [self.source[base + n * size : base + (n + 1) * size] for n in range(LAYERS)]

    def copy_in(self, i: int, entry: DecodedEntry) -> None:
        """Copy the payload into entry ``i``'s place in the destination."""
        self.dest[i * self.entry_bytes : (i + 1) * self.entry_bytes] = entry.payload


def _percentile(ordered: Sequence[float], q: float) -> float:
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _total(samples: Samples) -> float:
    return sum(seconds for seconds, _ in samples)


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


def row(
    tier: str, op: str, kvmux: dict[str, float], limit: str, raw: dict[str, float]
) -> dict[str, Any]:
    """One result: kvmux's figures, the limit's, and their ratio (kvmux / limit)."""
    found: dict[str, Any] = {"tier": tier, "op": op}
    found.update({f"kvmux_{name}": value for name, value in kvmux.items()})
    found["limit"] = limit
    found.update({f"limit_{name}": value for name, value in raw.items()})
    found["ratio"] = kvmux["gbps"] / raw["gbps"]
    return found


def _check_stored(stored: list[bool]) -> None:
    if not all(stored):
        raise RuntimeError("the store refused a write during the benchmark")


def check_sizes(count: int, entry_bytes: int) -> None:
    """Refuse sizes that cannot be cut into ``LAYERS`` bf16 layers."""
    if count < 1:
        raise ConfigError("entries", f"expected at least 1, got {count}")
    if entry_bytes < 2 * LAYERS or entry_bytes % (2 * LAYERS):
        raise ConfigError("entry_size", f"expected a positive multiple of {2 * LAYERS} bytes")


class Entries:
    """One run's entries: keys, layers (``layers``), and their encoded values."""

    def __init__(
        self,
        count: int,
        entry_bytes: int,
        layers: Layers | None = None,
        signing: SigningKeys | None = None,
        progress: Progress | None = None,
    ):
        check_sizes(count, entry_bytes)
        self.count, self.entry_bytes = count, entry_bytes
        self.layers = layers if layers is not None else HostLayers(count, entry_bytes)
        self.signing, self.progress = signing, progress
        layer_bytes = entry_bytes // LAYERS
        self.specs = tuple(LayerSpec((layer_bytes // 2,), "bfloat16") for _ in range(LAYERS))
        self.keys = [i.to_bytes(16, "big") for i in range(count)]
        self.values = [b"".join(self.encode_parts(i)) for i in range(count)]  # the limits'
        self.singles = [[i] for i in range(count)]
        self.batches = [list(range(i, min(i + BATCH, count))) for i in range(0, count, BATCH)]

    def encode_parts(self, i: int) -> ValueParts:
        """Entry ``i`` encoded from its layers as the pieces a save writes."""
        parts = self.layers.parts(i)
        return codec.encode_parts(NAMESPACE, self.keys[i], self.specs, parts, self.signing)

    def put(self, store: KVStore, unit: Unit) -> None:
        """Encode and write the unit's entries, as a tier's writer does."""
        items = [(self.keys[i], self.encode_parts(i)) for i in unit]
        _check_stored(store.put_many_parts(items))

    def load(self, i: int, value: bytes | None) -> None:
        """Verify entry ``i`` and copy its layers out, as a load does."""
        if value is None:
            raise RuntimeError(f"entry {i} missing during the benchmark")
        self.layers.copy_in(i, codec.decode(value, NAMESPACE, self.keys[i], self.signing))

    def measure(self, desc: str, *ops: Timed) -> list[dict[str, float]]:
        """Time ``ops`` in turn, REPEATS rounds; the summary of each one's fastest round."""
        best: list[Samples | None] = [None] * len(ops)
        for _ in range(REPEATS):
            for n, op in enumerate(ops):
                samples = op.run()
                if self.progress is not None:
                    self.progress(desc, sum(count for _, count in samples))
                fastest = best[n]
                if fastest is None or _total(samples) < _total(fastest):
                    best[n] = samples
        return [_summary(samples, self.entry_bytes) for samples in best if samples is not None]


def _write_file(path: Path, value: bytes) -> None:
    with open(path, "xb") as handle:  # always a new file
        handle.write(value)


def disk_rows(
    b: Entries, root: Path, direct_writes: bool = False
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Disk put and write, cold get and read (files evicted first), warm get and read,
    in ``root`` (removed afterwards)."""
    store_dir = root / "kvmux"
    capacity = 4 * b.count * (b.entry_bytes + 4096)
    store = DiskStore(store_dir, capacity=capacity, direct_writes=direct_writes)
    raw_dir = root / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    paths = [raw_dir / f"{i}.bin" for i in range(b.count)]
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

    try:  # the warm passes come right after the cold ones, which read their files in
        put, write, cold_get, cold_read, warm_get, warm_read = b.measure(
            "disk",
            Timed(b.singles, partial(b.put, store), fresh_store),
            Timed(b.singles, lambda u: _write_file(paths[u[0]], b.values[u[0]]), fresh_files),
            Timed(b.singles, get, partial(cold, store_dir)),
            Timed(b.singles, read, partial(cold, raw_dir)),
            Timed(b.singles, get),
            Timed(b.singles, read),
        )
    finally:
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
        row("disk", "put", put, "sequential write (open/write/close, new file)", write),
        {**row("disk", "get", cold_get, how, cold_read), "page_cache": reads},
        {**row(WARM_DISK, "get", warm_get, how, warm_read), "page_cache": "warm"},
    ]
    return rows, cache


def _server_info(client: Any, section: str) -> dict[str, Any]:
    """One INFO section; of the first node, for a cluster's per-node answer."""
    info = dict(client.info(section))
    nested = [value for value in info.values() if isinstance(value, dict)]
    return dict(nested[0]) if nested and len(nested) == len(info) else info


def redis_rows(b: Entries, spec: RedisSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Pipelined put and get of ``BATCH`` entries, beside pipelined SET and GET of the same
    values, under ``spec.key_prefix`` (every key there is removed before each put pass)."""
    from kvmux.stores.redis import RedisStore, redis_client

    raw_keys = [f"{spec.key_prefix}raw:{key.hex()}" for key in b.keys]
    store, plain = RedisStore(spec), redis_client(spec)

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

    try:
        put, get, raw_set, raw_get = b.measure(
            "redis",
            Timed(b.batches, partial(b.put, store), store.clear),
            Timed(b.batches, get_batch),
            Timed(b.batches, raw_set_batch, store.clear),
            Timed(b.batches, raw_get_batch),
        )
        server, memory = _server_info(plain, "server"), _server_info(plain, "memory")
    finally:
        store.clear()
        store.close()
        plain.close()
    how = f"redis-py pipeline(transaction=False), {BATCH} per round trip"
    rows = [
        row("redis", "put", put, f"pipelined SET ({how})", raw_set),
        row("redis", "get", get, f"pipelined GET ({how})", raw_get),
    ]
    info = {
        "version": str(server.get("redis_version", "?")),
        "maxmemory": int(memory.get("maxmemory", 0)),
        "maxmemory_policy": str(memory.get("maxmemory_policy", "?")),
        "batch": BATCH,
    }
    return rows, info


def bench_tier(
    spec: StoreSpec, entries: int, entry_bytes: int, progress: Progress | None = None
) -> dict[str, Any]:
    """Measure the disk or Redis tier ``spec`` names; its rows and what they ran on."""
    if isinstance(spec, MemorySpec):
        raise ConfigError("store.type", "a memory tier lives in its engine", ("disk", "redis"))
    run = uuid.uuid4().hex[:12]
    if isinstance(spec, DiskSpec) and not Path(spec.path).is_dir():
        raise StoreUnavailable(f"disk tier {spec.path}: no such directory")
    b = Entries(entries, entry_bytes, signing=spec.signing, progress=progress)
    if isinstance(spec, DiskSpec):
        rows, about = disk_rows(b, Path(spec.path) / f"kvmux-bench-{run}", spec.direct_writes)
    else:
        rows, about = redis_rows(b, replace(spec, key_prefix=f"{spec.key_prefix}bench-{run}:"))
    config = {"entries": entries, "entry_bytes": entry_bytes, "repeats": REPEATS}
    config["encoded_entry_bytes"] = len(b.values[0])
    about_key = "disk_page_cache" if isinstance(spec, DiskSpec) else "redis"
    return {"config": config, "rows": rows, about_key: about}


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as an aligned text table: GB/s of kvmux and of the limit, p50 latency."""
    header = ["tier", "op", "kvmux GB/s", "limit GB/s", "kvmux/limit", "kvmux p50 ms", "limit"]
    lines = [header]
    for r in rows:
        figures = [r["kvmux_gbps"], r["limit_gbps"], r["ratio"], r["kvmux_lat_p50_ms"]]
        lines.append([r["tier"], r["op"], *(f"{x:.3f}" for x in figures), r["limit"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
