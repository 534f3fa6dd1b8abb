"""StoreWorker: moves entries between the KV cache and a byte store (disk, Redis).

It runs a step's loads and hands its saves to a writer thread.

Synchronous loads are copied in before the forward pass that reads them; asynchronous
ones run on an ``AsyncLoader`` (``tier/worker/loader.py``) while the engine keeps stepping.
A save is gathered from the KV cache into staging slots allocated once (the save queue:
``HostSlab``), encoded and written from there, and its slots reused once written: no
host memory is allocated per save (fresh pages cost the forward pass more than the copy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import torch

from kvmux import codec
from kvmux.codec import DecodedEntry, LayerSpec, SigningKeys
from kvmux.errors import CorruptEntry, StoreError, UnverifiedEntry
from kvmux.keys import BlockKey, store_key
from kvmux.metrics import TierStats
from kvmux.stores.base import KVStore, ValueParts, value_nbytes
from kvmux.tier.scheduler.plan import BlockTransfer, TierStepPlan
from kvmux.tier.shards import BlockShards
from kvmux.tier.worker.base import WorkerBase
from kvmux.tier.worker.loader import FinishedLoads
from kvmux.tier.worker.read_buffers import ReadBuffers
from kvmux.tier.worker.save_queue import SaveQueueSizing
from kvmux.tier.worker.slab import HostSlab
from kvmux.tier.worker.transfer import (
    BlockMover,
    CopyStream,
    group_movers,
    head_movers,
    on_this_device,
)

__all__ = ["FinishedLoads", "StoreWorker"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_READERS = 4
UNVERIFIED_KEPT = 4096  # keys of entries that failed verification, remembered to replace
MAX_STAGING_SLOTS = 16384  # blocks a save queue holds at most (tiny blocks: fewer bytes)
ENTRY_SLACK = 64 * 1024  # room past a block's bytes in a read buffer: the entry's header


@dataclass(frozen=True)
class _Shard:
    """One stored shard of a planned block (``kvmux.tier.shards``): what moves as one entry."""

    row: int  # the block's index in the step's transfers
    mover: int  # the mover of its group's head position
    skey: bytes  # where the store holds it
    block_id: int


@dataclass(frozen=True)
class _Copied:
    """One shard copied out: its mover's layer specs, the staging slots, its slot."""

    specs: tuple[LayerSpec, ...]
    staging: HostSlab
    mover: int
    slot: int

    def parts(self) -> list[memoryview]:
        """Raw bytes of the shard's layers, without copying (once the copies landed)."""
        self.staging.flush()
        return self.staging.slot_parts(self.mover, self.slot)


class StoreWorker(WorkerBase):
    """Moves blocks between one byte store and the engine's KV cache for one rank.

    Each block is stored in shards (``kvmux.tier.shards``): this rank reads and writes the
    shards of its own KV heads; a block landed only if every one of its shards did.
    """

    def __init__(
        self,
        store: KVStore,
        namespace: bytes,
        rank: int,
        stats: TierStats,
        save_queue: int | SaveQueueSizing | None = None,
        signing: SigningKeys | None = None,
        shards: BlockShards | None = None,
    ):
        super().__init__(store.name, rank, stats)
        self._shards = shards or BlockShards()  # default: each block one shard, whole
        self._store = store
        self._signing = signing  # sign what is saved, load only what verifies
        self._namespace = namespace
        self._movers: list[BlockMover] = []  # one per head position of each KV cache group
        self._positions: list[list[tuple[int, int]]] = []  # per group: (mover, shard) each
        self._mover_bytes: list[int] = []  # host bytes of one shard of each mover
        self._writer = ThreadPoolExecutor(
            1, thread_name_prefix=f"kvmux-{store.name}-save", initializer=on_this_device()
        )
        self._readers = ThreadPoolExecutor(
            _READERS, thread_name_prefix=f"kvmux-{store.name}-read", initializer=on_this_device()
        )
        self._pending: dict[bytes, Future[None]] = {}  # guarded by _lock
        # what bounds the host bytes copied out and not yet written (sized at register)
        self._sizing = (
            save_queue if isinstance(save_queue, SaveQueueSizing) else SaveQueueSizing(save_queue)
        )
        self._save_queue = 0  # that bound in bytes, once the KV cache is registered
        self._queued_bytes = 0  # guarded by _lock
        self._group_bytes: list[int] = []  # host bytes of one block of each group's layers
        self._staging: HostSlab | None = None  # slots saves are copied into (the save queue)
        self._free_slots: list[int] = []  # guarded by _lock
        self._free_sorted = True  # whether _free_slots is in order; guarded by _lock
        # entries that failed verification: replaced when the block is saved again
        # (insertion-ordered, the oldest forgotten past UNVERIFIED_KEPT); guarded by
        # _lock (loads note them on loader threads, the writer thread reads them)
        self._unverified: dict[bytes, None] = {}
        self._read_buffers = ReadBuffers(0)  # sized once the KV cache is registered

    @property
    def store(self) -> KVStore:
        """The store this worker reads and writes."""
        return self._store

    @property
    def registered(self) -> bool:
        """Whether the KV cache is registered."""
        return bool(self._movers)

    def register(
        self,
        kv_caches: dict[str, torch.Tensor],
        num_blocks: int | None,
        groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """Adopt the engine's KV cache tensors (see ``WorkerBase.register``)."""
        if self._shards.split:
            per_group = head_movers(kv_caches, num_blocks, groups, len(self._shards.local))
        else:
            per_group = [[mover] for mover in group_movers(kv_caches, num_blocks, groups)]
        self._movers = [mover for movers in per_group for mover in movers]
        first = [sum(map(len, per_group[:g])) for g in range(len(per_group))]
        self._positions = [
            [(first[g] + p, self._shards.shard(p)) for p in range(len(movers))]
            for g, movers in enumerate(per_group)
        ]
        self._mover_bytes = [sum(s.nbytes for s in m.layer_specs) for m in self._movers]
        self._group_bytes = [
            sum(self._mover_bytes[mover] for mover, _ in positions) for positions in self._positions
        ]
        largest_entry = max(self._mover_bytes, default=0) + ENTRY_SLACK
        self._read_buffers = ReadBuffers(largest_entry)
        if self._movers:  # whoever writes the store cannot make one read take more
            self._store.limit_values(largest_entry)
        # as many slots as shards of the smallest group fit in the save queue (a slot holds
        # a shard of any group; vLLM's groups are of one size, the queue's bytes then)
        self._size_save_queue()
        slots = self._save_queue // max(1, min(self._mover_bytes, default=1))
        slots = min(slots, MAX_STAGING_SLOTS * max(1, len(self._shards.local)))
        if self._movers and slots and self._shards.writes:  # a replica saves nothing
            self._staging = HostSlab(self._movers, slots)
            self._free_slots = list(range(slots))
        if self._movers:
            device = self._movers[0].device
            host = sum(self._group_bytes) if device.type == "cpu" else None
            self._use_copies(CopyStream(device), host)

    def _size_save_queue(self) -> None:
        """Size the save queue to this rank's blocks and log it once."""
        size = self._sizing.size(sum(self._group_bytes))
        self._save_queue = size.bytes
        if self._movers:
            log.info("kvmux tier %s: save queue: %s", self._store.name, size.describe())

    def _load_async_batch(self, transfers: Sequence[BlockTransfer]) -> list[bool]:
        """On a loader thread: the blocks read in turn, not on reader threads."""
        return self._load_blocks(transfers, parallel=False)

    def _load_blocks(self, transfers: Sequence[BlockTransfer], parallel: bool = True) -> list[bool]:
        """Read, verify and copy in each block; whether each landed (failures counted)."""
        started = time.perf_counter()
        shards = self._shards_of(transfers)
        reads = len(shards) if self._store.parallel_reads else 0  # stores that read files
        with self._read_buffers.lend(reads) as buffers:
            shards_landed = self._read_and_copy_in(shards, buffers, parallel)
        landed = [True] * len(transfers)
        for shard, ok in zip(shards, shards_landed, strict=True):
            landed[shard.row] = landed[shard.row] and ok
        for transfer, ok in zip(transfers, landed, strict=True):
            if not ok:
                self._report_missing([transfer.key])
        self._stats.add(
            loaded_blocks=sum(landed),
            load_errors=len(landed) - sum(landed),
            load_seconds=time.perf_counter() - started,
        )
        return landed

    def _shards_of(self, transfers: Sequence[BlockTransfer]) -> list[_Shard]:
        """This rank's shards of each block, block by block."""
        shards = []
        for row, transfer in enumerate(transfers):
            assert transfer.group < len(self._positions), "a transfer of a group this worker lacks"
            for mover, shard in self._positions[transfer.group]:
                skey = store_key(transfer.key, shard)
                shards.append(_Shard(row, mover, skey, transfer.block_id))
        return shards

    def _read_and_copy_in(
        self, shards: Sequence[_Shard], buffers: list[bytearray], parallel: bool
    ) -> list[bool]:
        """Read (into ``buffers``, if any), verify and copy in; the entries' views of the
        buffers end here."""
        entries = self._fetch_all([shard.skey for shard in shards], buffers, parallel)
        verified = [
            None if data is None else self._verified(shard, data)
            for data, shard in zip(entries, shards, strict=True)
        ]
        return self._copy_in(shards, verified)

    def _copy_in(
        self, shards: Sequence[_Shard], entries: Sequence[DecodedEntry | None]
    ) -> list[bool]:
        """Copy the verified entries in, one batch per mover; which shards landed."""
        rows_of: dict[int, list[int]] = {}
        for row, (shard, entry) in enumerate(zip(shards, entries, strict=True)):
            if entry is not None:
                rows_of.setdefault(shard.mover, []).append(row)
        landed = [False] * len(shards)
        for mover, rows in rows_of.items():
            blocks = [shards[row].block_id for row in rows]
            batch = [entry for row in rows if (entry := entries[row]) is not None]
            try:
                self._movers[mover].copy_in_many(blocks, batch)
            except Exception as exc:  # a bug, never wrong KV: the blocks are recomputed
                self._warn_once("copy", "kvmux tier %s: copy-in failed: %r", self._store.name, exc)
                continue
            for row in rows:
                landed[row] = True
        return landed

    def _fetch_all(
        self, skeys: list[bytes], buffers: list[bytearray], parallel: bool = True
    ) -> Sequence[bytes | memoryview | None]:
        """Every entry, after any queued save of it; a failed read is a miss.

        A store whose reads block on I/O is read key by key into ``buffers`` (one per key),
        on reader threads if ``parallel``; a batched store in one ``get_many``.
        """
        with self._lock:
            pending = {self._pending[k] for k in skeys if k in self._pending}
        for future in pending:
            future.exception()  # waits; a failed save is simply a miss
        if self._store.parallel_reads:
            fetch = self._readers.map if parallel else map
            return list(fetch(self._fetch, skeys, buffers))
        return self._guarded("get", self._store.get_many, skeys, [None] * len(skeys))

    def _fetch(self, skey: bytes, buffer: bytearray) -> bytes | memoryview | None:
        return self._guarded("get", partial(self._store.get_into, buffer=buffer), skey, None)

    def _guarded(self, what: str, call: Callable[[Any], T], arg: Any, default: T) -> T:
        """``call(arg)``; any failure of the store is counted, logged once: ``default``.

        A StoreError is the store's own word; anything else is a bug in a store, which
        must not take the engine down either (its traceback is logged once).
        """
        try:
            return call(arg)
        except Exception as exc:
            self._stats.add(store_errors=1)
            self._warn_once(
                what, "kvmux tier %s: %s failed, treated as a miss: %r", self._store.name, what, exc
            )
            if not isinstance(exc, StoreError):
                log.debug("kvmux tier %s: unexpected store failure", self._store.name, exc_info=exc)
            return default

    def _verified(self, shard: _Shard, data: bytes | memoryview) -> DecodedEntry | None:
        """The decoded entry if it verifies and fits this engine's cache; else None (counted)."""
        skey = shard.skey
        try:
            entry = codec.decode(data, self._namespace, skey, self._signing)
            self._movers[shard.mover].check(entry)
        except UnverifiedEntry as exc:  # not deleted: it may be another key holder's
            self._stats.add(unverified_entries=1)
            self._note_unverified(skey)
            self._warn_once(
                "unverified",
                "kvmux tier %s: unverified entry, recomputing: %s",
                self._store.name,
                exc,
            )
            return None
        except CorruptEntry as exc:
            self._warn_once(
                "corrupt", "kvmux tier %s: bad entry, recomputing: %s", self._store.name, exc
            )
            self._drop(skey)
            return None
        self._stats.add(bytes_loaded=len(data))
        return entry

    def _note_unverified(self, skey: bytes) -> None:
        """An entry under ``skey`` did not verify: this engine's own save of it replaces it."""
        with self._lock:
            self._unverified[skey] = None
            if len(self._unverified) > UNVERIFIED_KEPT:
                del self._unverified[next(iter(self._unverified))]

    def _replace_unverified(self, keys: list[bytes]) -> None:
        """Delete the stored entries of ``keys`` that did not verify: this save replaces them."""
        with self._lock:
            if not self._unverified:
                return
            found = [key for key in keys if key in self._unverified]
            for key in found:
                del self._unverified[key]
        for key in found:
            self._drop(key)

    def _drop(self, skey: bytes) -> None:
        self._guarded("delete", self._store.delete, skey, None)

    # -- saves ---------------------------------------------------------------

    def _admit(self, saves: list[BlockTransfer]) -> tuple[list[BlockTransfer], list[int]]:
        """The saves that fit in the save queue whole (every shard of this rank), with one
        staging slot per shard; the rest are dropped and counted.

        A slow store must never make host memory grow without bound, nor make the
        forward pass wait: past the bound, saves are simply not made.
        """
        with self._lock:
            room, count, needed = self._save_queue - self._queued_bytes, 0, 0
            for transfer in saves:
                room -= max(1, self._bytes_of(transfer))
                needed += len(self._positions[transfer.group])
                if room < 0 or needed > len(self._free_slots):
                    break
                count += 1
            admitted, dropped = saves[:count], saves[count:]
            if not self._free_sorted:  # the lowest first: runs of slots, fewer copies
                self._free_slots.sort()
                self._free_sorted = True
            taken = sum(len(self._positions[t.group]) for t in admitted)
            slots, self._free_slots = self._free_slots[:taken], self._free_slots[taken:]
            self._queued_bytes += sum(map(self._bytes_of, admitted))
            queued = self._queued_bytes
        self._stats.observe_save_queue(queued)
        if dropped:
            self._report_missing(t.key for t in dropped)  # the scheduler's index forgets them
            self._stats.add(dropped_saves=len(dropped))
            self._warn_once(
                "queue",
                "kvmux tier %s: save queue full (%d of %d bytes waiting), dropping %d block "
                "saves (counted as dropped_saves): the store is slower than the engine, or "
                'a step saves more than the queue holds; raise "save_queue" in this tier\'s '
                "config to keep them",
                self._store.name,
                queued,
                self._save_queue,
                len(dropped),
            )
        return admitted, slots

    def _release(self, slots: list[int], queued: int) -> None:
        """Give back the staging slots and queued bytes of a save batch written (or not)."""
        with self._lock:
            self._queued_bytes -= queued
            if slots:
                self._free_slots += slots
                self._free_sorted = False

    def _bytes_of(self, transfer: BlockTransfer) -> int:
        """Host bytes of this rank's shards of one block of the transfer's group."""
        return self._group_bytes[transfer.group]

    def _copy_out(self, shards: Sequence[_Shard], slots: list[int], step: int) -> list[_Copied]:
        """Gather the planned shards into their staging slots, one batch per mover."""
        staging = self._staging
        assert staging is not None or not shards, "saves admitted without staging slots"
        rows_of: dict[int, list[int]] = {}
        for index, shard in enumerate(shards):
            rows_of.setdefault(shard.mover, []).append(index)
        copied: dict[int, _Copied] = {}
        for mover, indices in rows_of.items():
            assert staging is not None
            mover_slots = [slots[i] for i in indices]
            mark = staging.save(mover, [shards[i].block_id for i in indices], mover_slots)
            self._in_flight.saved(step, mark)
            specs = self._movers[mover].layer_specs
            for index, slot in zip(indices, mover_slots, strict=True):
                copied[index] = _Copied(specs, staging, mover, slot)
        return [copied[index] for index in range(len(shards))]

    def save(self, plan: TierStepPlan) -> None:
        """Copy the planned blocks out now; encode and write them off the critical path.

        Only the rank that writes a shard saves it (``BlockShards.writes``): a replica of
        another rank's heads saves nothing, nor evicts.
        """
        saves = self._untainted(plan)
        if not self._shards.writes or not self._movers or not (saves or plan.evictions):
            return
        saves, slots = self._admit(saves)
        queued = sum(map(self._bytes_of, saves))
        shards = self._shards_of(saves)
        try:
            copied = self._copy_out(shards, slots, plan.step)
        except BaseException:
            self._release(slots, queued)
            raise
        keys = [shard.skey for shard in shards]
        mine = [shard for _, shard in self._positions[0]] if self._positions else []
        evictions: list[bytes] = [store_key(k, s) for k in plan.evictions for s in mine]
        blocks = [saves[shard.row].key for shard in shards]
        future = self._writer.submit(self._write, blocks, keys, copied, evictions)
        with self._lock:
            for skey in keys:
                self._pending[skey] = future
        future.add_done_callback(partial(self._settle, blocks, keys, slots, queued))

    def _settle(
        self,
        blocks: list[BlockKey],
        keys: list[bytes],
        slots: list[int],
        queued: int,
        future: Future[None],
    ) -> None:
        self._release(slots, queued)
        with self._lock:
            for skey in keys:
                if self._pending.get(skey) is future:
                    del self._pending[skey]
        error = None if future.cancelled() else future.exception()
        if error is not None:  # never lost: a failed batch is counted and logged
            self._stats.add(save_errors=len(set(blocks)))
            self._report_missing(blocks)
            self._warn_once(
                "write", "kvmux tier %s: a save batch failed: %r", self._store.name, error
            )

    def _write(
        self,
        blocks: list[BlockKey],
        keys: list[bytes],
        copied: list[_Copied],
        evictions: list[bytes],
    ) -> None:
        for skey in evictions:
            self._drop(skey)
        started = time.perf_counter()
        self._replace_unverified(keys)
        held = self._guarded("lookup", self._store.contains_many, keys, [False] * len(keys))
        rows = [row for row in range(len(keys)) if not held[row]]
        items = [
            (keys[row], self._encode(keys[row], copied[row].specs, copied[row].parts()))
            for row in rows
        ]
        stored = self._guarded("put", self._store.put_many_parts, items, [False] * len(items))
        failed = {blocks[row] for row, ok in zip(rows, stored, strict=True) if not ok}
        self._report_missing(failed)
        kept = zip(items, stored, strict=True)
        written = sum(value_nbytes(parts) for (_, parts), ok in kept if ok)
        self._stats.add(  # blocks: those whose every shard written here is stored
            saved_blocks=len({blocks[row] for row in rows} - failed),
            save_errors=len(failed),
            bytes_saved=written,
            save_seconds=time.perf_counter() - started,
        )
        if not self._store.batched_io:  # local stores: cheap to ask their size
            self._stats.observe_stored(self._store.used_bytes())

    def _encode(
        self, skey: bytes, specs: Sequence[LayerSpec], parts: list[memoryview]
    ) -> ValueParts:
        return codec.encode_parts(self._namespace, skey, specs, parts, self._signing)

    def flush(self) -> None:
        """Wait until every queued save is written."""
        self._writer.submit(lambda: None).result()

    def clear(self) -> None:
        """Drop everything the store holds, once the queued saves are written."""
        self.flush()
        self._store.clear()

    def close(self) -> None:
        """Stop loads, finish queued saves and release threads and the store."""
        super().close()
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self._staging = None  # the save queue's host memory goes with the last save
        self._store.close()
