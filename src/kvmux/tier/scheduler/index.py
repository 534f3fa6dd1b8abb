"""The scheduler's view of a tier: which keys it holds, without touching any bytes."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TypeVar

from kvmux.codec import SigningKeys
from kvmux.keys import BlockKey, store_key
from kvmux.metrics import TierStats
from kvmux.stores.base import KVStore
from kvmux.tier.scheduler.generation import GenerationTracker, new_generation

__all__ = ["MirrorIndex", "RecentSaves", "RemoteStoreView", "SharedStoreView", "TierView"]

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_GENERATION = bytes(16)  # the generation of a view that has none of its own


class TierView(ABC):
    """What the scheduler may ask about a tier."""

    cheap_contains = True  # False: the tier scheduler skips per-block checks; the worker dedups

    @abstractmethod
    def count_prefix(self, keys: Sequence[BlockKey]) -> int:
        """How many of ``keys``, from the first, the tier holds without a gap."""

    @abstractmethod
    def contains(self, key: BlockKey) -> bool:
        """Whether the tier holds ``key``."""

    def count_prefix_nowait(self, keys: Sequence[BlockKey]) -> int | None:
        """``count_prefix``, or None if the answer is not ready yet (ask again later)."""
        return self.count_prefix(keys)

    def close(self) -> None:
        """Release threads or connections."""
        return None

    def record_saved(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """Note keys about to be saved; returns keys the worker must evict first."""
        return []

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Drop keys the worker reported missing."""
        return None

    def generation(self) -> bytes | None:
        """The tier's generation, which new requests' keys are bound to; None: unknown now."""
        return FIRST_GENERATION

    def reset(self) -> bool:
        """Move the tier to a new generation: nothing stored before is served after."""
        return False


class RecentSaves:
    """Keys whose saves were planned moments ago: held, though perhaps not written yet.

    The workers write saves off the forward path, so a request right behind another
    with the same prefix would miss blocks still in the writer's queue. The worker's
    load waits for a queued save of the same key, so counting them is safe; a save
    that is dropped or fails is reported back and forgotten here. After ``ttl``
    seconds the store answers alone.
    """

    def __init__(self, ttl: float = 10.0, max_keys: int = 65536):
        self._ttl = ttl
        self._max_keys = max_keys
        self._planned: OrderedDict[BlockKey, float] = OrderedDict()
        self._lock = threading.Lock()  # remote lookups read from a thread

    def add(self, keys: Iterable[BlockKey]) -> None:
        """Note keys whose saves were just planned."""
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._planned[key] = now
                self._planned.move_to_end(key)
            while len(self._planned) > self._max_keys:
                self._planned.popitem(last=False)

    def discard(self, keys: Iterable[BlockKey]) -> None:
        """Forget keys whose saves were dropped or failed."""
        with self._lock:
            for key in keys:
                self._planned.pop(key, None)

    def count_prefix(self, keys: Sequence[BlockKey]) -> int:
        """How many of ``keys``, from the first, were planned within the last ``ttl`` s."""
        oldest = time.monotonic() - self._ttl
        with self._lock:
            while self._planned and next(iter(self._planned.values())) < oldest:
                self._planned.popitem(last=False)
            count = 0
            for key in keys:
                if key not in self._planned:
                    break
                count += 1
            return count

    def clear(self) -> None:
        """Forget everything (a new generation)."""
        with self._lock:
            self._planned.clear()


class LostKeys:
    """Keys the store answered for but that did not load (corrupt, forged, evicted since).

    They count as absent, in lookups and for saves, until this engine saves them again:
    a request is not offered a block that just failed, and the engine's own entry
    replaces one that does not verify. The oldest are forgotten past ``max_keys``.
    """

    def __init__(self, max_keys: int = 65536):
        self._max_keys = max_keys
        self._lost: OrderedDict[BlockKey, None] = OrderedDict()
        self._lock = threading.Lock()  # remote lookups read from a thread

    def add(self, keys: Iterable[BlockKey]) -> None:
        """Note keys that could not be loaded or saved."""
        with self._lock:
            for key in keys:
                self._lost[key] = None
            while len(self._lost) > self._max_keys:
                self._lost.popitem(last=False)

    def discard(self, keys: Iterable[BlockKey]) -> None:
        """Keys saved again: the store's answer holds for them once more."""
        with self._lock:
            if self._lost:
                for key in keys:
                    self._lost.pop(key, None)

    def usable(self, keys: Sequence[BlockKey]) -> int:
        """How many of ``keys``, from the first, are not lost."""
        with self._lock:
            if not self._lost:
                return len(keys)
            for index, key in enumerate(keys):
                if key in self._lost:
                    return index
            return len(keys)

    def clear(self) -> None:
        """Forget everything (a new generation)."""
        with self._lock:
            self._lost.clear()


class SharedStoreView(TierView):
    """A store both halves can open (disk, Redis): ask it directly; errors are misses.

    A block is held only if every one of its ``shards`` is (``kvmux.tier.shards``: every
    KV head of every pipeline stage), whichever ranks wrote them; a shard that is present
    and does not verify is a load error that the engine recomputes.
    Blocks whose saves this engine planned moments ago count as held (``RecentSaves``).
    """

    def __init__(
        self,
        store: KVStore,
        stats: TierStats,
        signing: SigningKeys | None = None,
        shards: int = 1,
    ):
        self._store = store
        self._shards = max(1, shards)  # stored shards of every block
        self._stats = stats
        self._generations = GenerationTracker(signing)  # where this engine is
        self._record_lock = threading.Lock()  # a reset's record and write-backs, one at a time
        self._failing: set[str] = set()  # kinds of call failing now (logged once)
        self._recent = RecentSaves()
        self._lost = LostKeys()

    def count_prefix(self, keys: Sequence[BlockKey]) -> int:
        """Ask the store, then count on through saves still being written; stop at a key
        that failed to load (``LostKeys``).

        A failing store holds nothing, saves in flight included.
        """
        keys = keys[: self._lost.usable(keys)]
        if not keys:
            return 0
        held = self._guarded("lookup", lambda: self._held(keys), None)
        if held is None:  # the store cannot be reached: what it writes cannot load either
            return 0
        return held + self._recent.count_prefix(keys[held:])

    def _held(self, keys: Sequence[BlockKey]) -> int:
        """The blocks from the first with every shard in the store: shard 0 of each first
        (a miss costs one check per block), then every other shard of those."""
        first = self._store.count_prefix([store_key(key, 0) for key in keys])
        if self._shards == 1 or not first:
            return first
        rest = [store_key(key, s) for key in keys[:first] for s in range(1, self._shards)]
        return self._store.count_prefix(rest) // (self._shards - 1)

    def record_saved(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """Count the keys as held while they are written; the store evicts on its own."""
        keys = list(keys)
        self._lost.discard(keys)
        self._recent.add(keys)
        return []

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Saves dropped or failed, or entries that could not be loaded: absent until
        saved again."""
        keys = list(keys)
        self._recent.discard(keys)
        self._lost.add(keys)

    def contains(self, key: BlockKey) -> bool:
        """Ask the store; a failing store holds nothing."""
        return self.count_prefix([key]) == 1

    def generation(self) -> bytes | None:
        """Read from the store each time, so a reset by any engine applies at once.

        A failed read keeps the current generation (the failure is counted); None only
        while no read ever succeeded. See ``GenerationTracker.observe`` for what a record
        read is worth.
        """
        return self._read_generation(self._generations.resets)

    def _read_generation(self, resets_seen: int) -> bytes | None:
        """Read the store's record and follow it, unless a reset came after ``resets_seen``."""
        missing = object()
        raw = self._guarded("generation", self._store.read_generation, missing)
        if raw is missing:
            return self._generations.current
        current, write_back = self._generations.observe(raw, resets_seen)
        if write_back is not None:
            if raw is not None:
                log.warning(
                    "kvmux tier %s: the generation record is not valid or names a generation "
                    "before this engine's; writing this engine's",
                    self._store.name,
                )
            with self._record_lock:  # never over a reset's record: one writer at a time
                if self._generations.is_current(write_back):
                    self._write_record(write_back, "generation")
        return current

    def _write_record(self, record: bytes, what: str) -> bool:
        failed = object()
        written = self._guarded(what, partial(self._store.write_generation, record), failed)
        return written is not failed

    def reset(self) -> bool:
        """Move to a new generation at once, past the store's; False if the store could
        not record it (this engine then serves nothing stored before, but other engines
        do not follow)."""
        with self._record_lock:
            raw = self._guarded("reset", self._store.read_generation, None)
            record = self._generations.reset(raw)
            self._recent.clear()
            self._lost.clear()
            return self._write_record(record, "reset")

    def _guarded(self, what: str, call: Callable[[], T], default: T) -> T:
        """``call()``; any failure of the store (a StoreError, or a bug) gives ``default``.

        Logged once per kind of call until that call succeeds again, then counted only.
        """
        try:
            result = call()
        except Exception as exc:
            self._stats.add(store_errors=1)
            level = logging.DEBUG if what in self._failing else logging.WARNING
            self._failing.add(what)
            log.log(
                level,
                "kvmux tier %s: %s failed, treated as a miss: %r",
                self._store.name,
                what,
                exc,
            )
            return default
        self._failing.discard(what)
        return result

    def close(self) -> None:
        """Close the store."""
        self._store.close()


class RemoteStoreView(SharedStoreView):
    """A networked store: lookups run on a thread so a slow server never stalls the scheduler.

    A lookup waits at most ``wait_seconds``; if the answer has not landed, the connector
    tells vLLM to ask again at its next step, when the landed answer is used.
    """

    cheap_contains = False
    _MAX_IN_FLIGHT = 4096

    GENERATION_REFRESH_SECONDS = 1.0  # how often the server's generation is read again

    def __init__(
        self,
        store: KVStore,
        stats: TierStats,
        wait_seconds: float,
        signing: SigningKeys | None = None,
        shards: int = 1,
    ):
        super().__init__(store, stats, signing, shards)
        self._wait = wait_seconds
        self._pool = ThreadPoolExecutor(2, thread_name_prefix=f"kvmux-{store.name}-lookup")
        self._in_flight: dict[tuple[bytes, bytes, int], Future[int]] = {}  # (ends, length)
        self._refresh: Future[bytes | None] | None = None
        self._refreshed_at = time.monotonic()
        super().generation()  # once at start, bounded by the socket timeouts

    def generation(self) -> bytes | None:
        """The last generation read, re-read off the scheduler thread once a second.

        None while no read ever succeeded: requests are then neither loaded nor saved.
        """
        now = time.monotonic()
        idle = self._refresh is None or self._refresh.done()
        if idle and now - self._refreshed_at >= self.GENERATION_REFRESH_SECONDS:
            self._refreshed_at = now
            # a read that lands after a reset changes nothing (GenerationTracker.observe)
            self._refresh = self._pool.submit(self._read_generation, self._generations.resets)
        return self._generations.current

    def count_prefix_nowait(self, keys: Sequence[BlockKey]) -> int | None:
        """Start or collect a batched lookup; None while it is in flight."""
        if not keys:
            return 0
        token = (keys[0], keys[-1], len(keys))  # a window's keys come last block first
        future = self._in_flight.get(token)
        if future is None:
            if len(self._in_flight) >= self._MAX_IN_FLIGHT:
                self._in_flight.pop(next(iter(self._in_flight)))
            future = self._pool.submit(self.count_prefix, list(keys))
            self._in_flight[token] = future
        if not future.done():
            wait([future], timeout=self._wait)
        if not future.done():
            return None
        del self._in_flight[token]
        return future.result()

    def contains(self, key: BlockKey) -> bool:
        """Not asked per block: the worker skips entries the server already holds."""
        return False

    def close(self) -> None:
        """Stop the lookup threads and close the store."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().close()


class MirrorIndex(TierView):
    """Authoritative LRU index of a worker-local store (memory).

    The scheduler decides what the worker's store holds: it admits keys as it plans
    their saves and tells the worker which keys to evict, so the index and the store
    agree without any message from the worker, whatever process the worker runs in.
    """

    def __init__(self, capacity: int, entry_size: int):
        self.capacity = capacity
        self.entry_size = entry_size
        self._keys: OrderedDict[BlockKey, None] = OrderedDict()
        self._generation = FIRST_GENERATION  # the memory tier lives and dies with this engine
        self._dropped: list[BlockKey] = []  # keys a reset dropped, evicted with the next plan

    @property
    def max_entries(self) -> int:
        """How many entries fit in the budget."""
        return self.capacity // self.entry_size

    def count_prefix(self, keys: Sequence[BlockKey]) -> int:
        """Count held keys from the first; hits become most recently used."""
        count = 0
        for key in keys:
            if key not in self._keys:
                break
            self._keys.move_to_end(key)
            count += 1
        return count

    def contains(self, key: BlockKey) -> bool:
        """Whether the key is held."""
        return key in self._keys

    def record_saved(self, keys: Iterable[BlockKey]) -> list[BlockKey]:
        """Admit keys, evicting least recently used ones past the budget."""
        evicted, self._dropped = self._dropped, []
        for key in keys:
            if self.max_entries == 0:
                break
            self._keys[key] = None
            self._keys.move_to_end(key)
            while len(self._keys) > self.max_entries:
                old, _ = self._keys.popitem(last=False)
                evicted.append(old)
        return evicted

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Drop keys the worker could not serve."""
        for key in keys:
            self._keys.pop(key, None)

    def generation(self) -> bytes | None:
        """This engine's current generation (a new random id at each reset)."""
        return self._generation

    def reset(self) -> bool:
        """A new generation; the workers evict every entry of the old one with the next plan."""
        self._generation = new_generation()
        self._dropped.extend(self._keys)
        self._keys.clear()
        return True

    def __len__(self) -> int:
        return len(self._keys)
