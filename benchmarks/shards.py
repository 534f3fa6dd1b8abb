"""Save and load throughput of per-head shards against one entry per rank, at TP=1 and TP=2.

Engine-free: each rank is a ``StoreWorker`` over stand-in KV caches of a real model's
block (Llama 3.1 8B by default: 32 layers, 8 KV heads of 128, bf16, 16-token blocks, so
2 MiB per block at TP=1), registered as vLLM's ``[blocks, heads, tokens, bytes]`` views.
The ranks of one TP size run at once, each on its own thread with its own worker (as
each rank is its own process in vLLM), over one disk folder or one Redis server.

Two layouts of the same bytes:

* ``per-rank``: each rank's share of a block in one entry (kvmux's layout before shards,
  and what other caches do): one entry per block and rank, readable only at that TP size;
* ``per-head``: one entry per KV head (``kvmux.tier.shards``), readable at any TP size.

A save is timed from ``save`` to ``flush`` (every entry written), a load over a fresh
worker's ``load``; the disk rows read through the page cache (the writes are recent),
which is the case that shows the per-entry costs most. The figures that matter are the
ratios ``per-head / per-rank`` at the same TP size, in one run.

``python -m benchmarks.shards [--blocks 64] [--stores disk,redis] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kvmux.config import DiskSpec, RedisSpec
from kvmux.keys import block_keys, namespace_id
from kvmux.metrics import TierStats
from kvmux.stores import KVStore
from kvmux.stores.factory import open_store
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan
from kvmux.tier.shards import BlockShards, block_shards
from kvmux.tier.worker.store_worker import StoreWorker

__all__ = ["Row", "main", "measure"]

NS = namespace_id({"benchmark": "shards"})
LAYOUTS = ("per-rank", "per-head")


@dataclass(frozen=True)
class Shape:
    """A model's KV cache, as one rank at TP=1 holds it."""

    layers: int = 32
    heads: int = 8
    tokens: int = 16  # per block
    head_bytes: int = 2 * 128 * 2  # K and V of one token of one head, bf16

    @property
    def block_bytes(self) -> int:
        """Bytes of one block, every layer and head."""
        return self.layers * self.heads * self.tokens * self.head_bytes


@dataclass(frozen=True)
class Row:
    """One store, TP size and layout: what was written and how fast."""

    store: str
    tp: int
    layout: str
    entries: int
    bytes: int
    save_gbps: float
    load_gbps: float


def _caches(shape: Shape, heads: int, blocks: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    size = (blocks + 1, heads, shape.tokens, shape.head_bytes)
    return {
        f"layer.{i}": torch.randint(0, 255, size, dtype=torch.uint8, generator=generator)
        for i in range(shape.layers)
    }


def _shards(layout: str, shape: Shape, tp: int, rank: int) -> BlockShards:
    if layout == "per-head":
        return block_shards(shape.heads, tp, rank)
    return BlockShards(stage=rank)  # the rank's heads in one entry, under a rank's own key


def _parallel(calls: list[Callable[[], None]]) -> float:
    """Seconds until every call, each on its own thread, returned."""
    threads = [threading.Thread(target=call) for call in calls]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def _one(store: Callable[[], KVStore], shape: Shape, tp: int, layout: str, blocks: int) -> Row:
    keys = block_keys(NS, list(range(blocks * shape.tokens)), shape.tokens)
    plan = TierStepPlan(saves=[BlockTransfer(k, 1 + i) for i, k in enumerate(keys)])
    heads = shape.heads // tp
    queue = 2 * blocks * shape.block_bytes  # room for every save: none is dropped
    savers, loaders, stats = [], [], []
    for rank in range(tp):
        shards = _shards(layout, shape, tp, rank)
        saver = StoreWorker(store(), NS, rank, TierStats(), queue, shards=shards)
        saver.register(_caches(shape, heads, blocks, rank), blocks + 1)
        loader_stats = TierStats()
        loader = StoreWorker(store(), NS, rank, loader_stats, queue, shards=shards)
        loader.register(_caches(shape, heads, blocks, 100 + rank), blocks + 1)
        savers.append(saver)
        loaders.append(loader)
        stats.append(loader_stats)

    def save(worker: StoreWorker) -> Callable[[], None]:
        def run() -> None:
            worker.save(plan)
            worker.flush()

        return run

    def load(worker: StoreWorker) -> Callable[[], None]:
        return lambda: worker.load(plan.saves)

    try:
        save_seconds = _parallel([save(w) for w in savers])
        load_seconds = _parallel([load(w) for w in loaders])
        assert all(s.loaded_blocks == blocks for s in stats), "a load missed"
        entries = blocks * (shape.heads if layout == "per-head" else tp)
        stored = sum(s.bytes_loaded for s in stats)
    finally:
        for worker in savers + loaders:
            worker.close()
    total = blocks * shape.block_bytes
    return Row(
        store="",
        tp=tp,
        layout=layout,
        entries=entries,
        bytes=stored,
        save_gbps=total / save_seconds / 1e9,
        load_gbps=total / load_seconds / 1e9,
    )


@contextmanager
def _disk() -> Iterator[Callable[[], KVStore]]:
    folder = Path(tempfile.mkdtemp(prefix="kvmux-shards-"))
    try:
        yield lambda: open_store(DiskSpec(path=folder, capacity=1 << 36))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _redis() -> Iterator[Callable[[], KVStore]]:
    from kvmux.testing.redis_server import RedisServer

    folder = Path(tempfile.mkdtemp(prefix="kvmux-shards-redis-"))
    server = RedisServer(folder).start()
    try:
        yield lambda: open_store(RedisSpec(url=server.url, socket_timeout=10.0))
    finally:
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


STORES = {"disk": _disk, "redis": _redis}


def measure(stores: tuple[str, ...], shape: Shape, blocks: int, rounds: int) -> list[Row]:
    """Every store, TP size and layout, ``rounds`` times each in alternation: the medians."""
    rows: list[Row] = []
    for name in stores:
        with STORES[name]() as store:
            for tp in (1, 2):
                runs: dict[str, list[Row]] = {layout: [] for layout in LAYOUTS}
                for _ in range(rounds):
                    for layout in LAYOUTS:
                        store().clear()
                        runs[layout].append(_one(store, shape, tp, layout, blocks))
                for layout, done in runs.items():
                    rows.append(
                        Row(
                            name,
                            tp,
                            layout,
                            done[0].entries,
                            done[0].bytes,
                            statistics.median(r.save_gbps for r in done),
                            statistics.median(r.load_gbps for r in done),
                        )
                    )
    return rows


def ratios(rows: list[Row]) -> list[dict[str, object]]:
    """Per store and TP size: per-head against per-rank, bytes and speed."""
    out: list[dict[str, object]] = []
    by = {(r.store, r.tp, r.layout): r for r in rows}
    for store, tp in sorted({(r.store, r.tp) for r in rows}):
        head, rank = by[(store, tp, "per-head")], by[(store, tp, "per-rank")]
        out.append(
            {
                "store": store,
                "tp": tp,
                "bytes": head.bytes / rank.bytes,
                "save": head.save_gbps / rank.save_gbps,
                "load": head.load_gbps / rank.load_gbps,
            }
        )
    return out


def table(rows: list[Row]) -> str:
    """The rows and ratios as Markdown."""
    lines = [
        "| store | TP | layout | entries | bytes read | save GB/s | load GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.store} | {r.tp} | {r.layout} | {r.entries} | {r.bytes / 2**20:.1f} MiB "
            f"| {r.save_gbps:.2f} | {r.load_gbps:.2f} |"
        )
    lines += ["", "| store | TP | bytes | save | load |", "|---|---|---|---|---|"]
    for ratio in ratios(rows):
        lines.append(
            f"| {ratio['store']} | {ratio['tp']} | {ratio['bytes']:.3f} | {ratio['save']:.2f} "
            f"| {ratio['load']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run and print the table (and write JSON with ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__)
    parser.add_argument("--blocks", type=int, default=64, help="blocks saved and loaded")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument("--stores", default="disk,redis", help=f"of {', '.join(STORES)}")
    parser.add_argument("--layers", type=int, default=Shape.layers)
    parser.add_argument("--heads", type=int, default=Shape.heads)
    parser.add_argument("--tokens", type=int, default=Shape.tokens, help="tokens per block")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    shape = Shape(args.layers, args.heads, args.tokens)
    stores = tuple(s for s in args.stores.split(",") if s)
    rows = measure(stores, shape, args.blocks, args.rounds)
    print(table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"shape": asdict(shape), "blocks": args.blocks, "rows": [asdict(r) for r in rows]}
        data["ratios"] = ratios(rows)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
