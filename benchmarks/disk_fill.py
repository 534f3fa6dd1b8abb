"""The benchmark's disk tier: one directory, full from the start, as a serving tier is.

A disk tier that has been serving is full: every entry written evicts one, whose file
the next write overwrites in place (``stores/spare_pool.py``). An empty tier grows
instead, a new file and new page-cache pages for every entry, which on a virtual machine
that hands free memory back to its host costs more than the writes themselves
(docs/benchmarks.md). So a run fills its disk tier with filler entries first, as it
fills its Redis, and empties it for an engine by moving it to a new generation: the
files stay, stale, and are evicted before anything an engine wrote.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvmux.config import parse_capacity
from kvmux.stores import DiskStore
from kvmux.tier.scheduler.generation import decode_generation, encode_record, new_generation

__all__ = ["fill_disk", "forget_disk"]

FILLER_NAMESPACE = b"kvmux bench disk filler"  # keys no engine ever computes


def _store(path: Path, capacity: str) -> DiskStore:
    return DiskStore(path, parse_capacity(capacity, "capacity"), touch=False)


def fill_disk(path: Path, entry_bytes: int, capacity: str) -> int:
    """Fill the disk tier at ``path`` with filler entries up to its capacity; how many."""
    store = _store(path, capacity)
    value, count = bytes(entry_bytes), 0
    while store.used_bytes() + entry_bytes <= store.capacity:
        key = hashlib.blake2b(count.to_bytes(8, "little"), key=FILLER_NAMESPACE).digest()
        store.put(key, value)
        count += 1
    return count


def forget_disk(path: Path, capacity: str) -> bytes:
    """Move the disk tier at ``path`` to a new generation: its entries are never served
    again, and evicted first; the new generation's id."""
    store, generation = _store(path, capacity), new_generation()
    before = decode_generation(store.read_generation(), None)
    sequence = 1 if before is None else before[0] + 1  # past the tier's: engines follow it
    store.write_generation(encode_record(generation, None, sequence))
    return generation
