"""FaultyStore: any kvmux store, with the faults a small JSON control file names.

The control file is re-read whenever it changes (inode, mtime or size), so a test can
switch faults between engine steps from outside the engine process (write it with
``write_control``, which checks it and replaces the file atomically). A missing file
means no fault. Its keys, all optional:

    fault     none (default) | error | latency | corrupt | truncate | enospc | evict
    on        the calls it hits: "reads" (lookups and gets), "writes" (puts, deletes
              and resets), "both" (default), or a list of groups (see GROUPS)
    fraction  share of the calls (of the values, for corrupt, truncate and evict) hit,
              drawn from random.Random(seed), restarted whenever the file changes
    seed      the seed of those draws (default 0)
    error     for ``error``: "store" raises StoreError, "unavailable" StoreUnavailable
    ms        for ``latency``: milliseconds slept before each call
    keep      for ``truncate``: share of the value's bytes returned (default 0.5)
    phase     a label copied into the record
    record    a file that gets one JSON line per injected fault: phase, store name,
              fault, method, keys (how many keys the call or value had), raised

What each fault does, and the groups it can hit:

    error     the call raises                                   any group
    latency   the call sleeps ``ms`` first, then runs           any group
    corrupt   a value read has its middle byte flipped          get
    truncate  a value read is cut to its first ``keep`` share   get
    enospc    the write raises StoreError from OSError(ENOSPC)  put
    evict     the value is gone when read (deleted, None)       get
              although the lookup just said present

Every method is thread-safe, as the store contract requires.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kvmux.errors import StoreError, StoreUnavailable
from kvmux.stores.base import KVStore, StoredEntry, ValueParts

__all__ = ["FAULTS", "GROUPS", "FaultSpec", "FaultyStore", "read_record", "write_control"]

T = TypeVar("T")
GROUPS = {  # store methods by group; used_bytes, limit_values and close are never faulted
    "lookup": ("contains", "contains_many", "count_prefix", "read_generation", "walk"),
    "get": ("get", "get_into", "get_many", "head", "head_many"),
    "put": ("put", "put_many", "put_many_parts"),
    "delete": ("delete", "delete_many", "clear", "write_generation"),
}
_ON = {
    "reads": frozenset({"lookup", "get"}),
    "writes": frozenset({"put", "delete"}),
    "both": frozenset(GROUPS),
}
FAULTS = {  # the groups each fault can hit
    "none": frozenset[str](),
    "error": frozenset(GROUPS),
    "latency": frozenset(GROUPS),
    "corrupt": frozenset({"get"}),
    "truncate": frozenset({"get"}),
    "enospc": frozenset({"put"}),
    "evict": frozenset({"get"}),
}
_VALUE_FAULTS = frozenset({"corrupt", "truncate", "evict"})  # drawn per value, not per call


@dataclass(frozen=True)
class FaultSpec:
    """One control file's contents, checked."""

    fault: str = "none"
    on: frozenset[str] = frozenset(GROUPS)
    fraction: float = 1.0
    seed: int = 0
    error: str = "store"
    ms: float = 0.0
    keep: float = 0.5
    phase: str = ""
    record: str | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> FaultSpec:
        """Check a control mapping; ValueError names the bad key."""
        unknown = set(raw) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ValueError(f"unknown fault control keys {sorted(unknown)}")
        spec = cls(**{**raw, "on": _groups(raw.get("on", "both"))})
        if spec.fault not in FAULTS:
            raise ValueError(f"fault {spec.fault!r}: expected one of {sorted(FAULTS)}")
        if spec.error not in ("store", "unavailable"):
            raise ValueError(f"error {spec.error!r}: expected 'store' or 'unavailable'")
        if not 0.0 <= spec.fraction <= 1.0 or not 0.0 <= spec.keep < 1.0 or spec.ms < 0:
            raise ValueError(f"fraction, keep or ms out of range in {dict(raw)}")
        return spec

    def hits(self, group: str) -> bool:
        """Whether this fault applies to calls of ``group``."""
        return group in self.on and group in FAULTS[self.fault]

    def to_json(self) -> dict[str, Any]:
        """The control mapping that parses back to this spec."""
        data = asdict(self)
        data["on"] = sorted(self.on)
        return data


def _groups(on: str | Iterable[str]) -> frozenset[str]:
    if isinstance(on, str):
        if on not in _ON:
            raise ValueError(f"on {on!r}: expected {sorted(_ON)} or a list of {sorted(GROUPS)}")
        return _ON[on]
    groups = frozenset(on)
    if not groups <= set(GROUPS):
        raise ValueError(f"on {sorted(groups)}: groups are {sorted(GROUPS)}")
    return groups


def write_control(path: str | os.PathLike[str], **spec: Any) -> FaultSpec:
    """Check ``spec`` and replace the control file at ``path`` atomically."""
    parsed = FaultSpec.parse(spec)
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(parsed.to_json()))
    os.replace(tmp, target)
    return parsed


def read_record(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every injected fault a record file holds, in order."""
    target = Path(path)
    if not target.exists():
        return []
    return [json.loads(line) for line in target.read_text().splitlines() if line]


class FaultyStore(KVStore):
    """Wraps a store; each call first consults the control file, then maybe misbehaves."""

    def __init__(self, inner: KVStore, control: str | os.PathLike[str]):
        self.inner = inner
        self.name = inner.name
        self.capacity = inner.capacity
        self.batched_io = inner.batched_io
        self.parallel_reads = inner.parallel_reads
        self.control = Path(control)
        self.injected: Counter[str] = Counter()  # "fault:method" -> calls or values hit
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._spec = FaultSpec()
        self._rng = random.Random(0)

    # -- control ---------------------------------------------------------------

    def spec(self) -> FaultSpec:
        """The fault in force now (the control file is re-read if it changed)."""
        try:
            info = os.stat(self.control)
        except FileNotFoundError:
            signature = None
        else:
            signature = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if signature != self._signature:
                raw = json.loads(self.control.read_text()) if signature is not None else {}
                self._spec = FaultSpec.parse(raw)
                self._rng = random.Random(self._spec.seed)
                self._signature = signature
            return self._spec

    def _draw(self, spec: FaultSpec) -> bool:
        if spec.fraction >= 1.0:
            return True
        with self._lock:
            return self._rng.random() < spec.fraction

    def _note(self, spec: FaultSpec, method: str, keys: int, raised: bool) -> None:
        with self._lock:
            self.injected[f"{spec.fault}:{method}"] += 1
        if spec.record is None:
            return
        line = {"phase": spec.phase, "store": self.name, "fault": spec.fault, "method": method}
        data = (json.dumps({**line, "keys": keys, "raised": raised}) + "\n").encode()
        fd = os.open(spec.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)  # one small O_APPEND write: lines never interleave
        finally:
            os.close(fd)

    def _call(self, group: str, method: str, keys: int, run: Callable[[], T]) -> T:
        """``run()`` after the call-level faults (error, enospc, latency) of ``group``."""
        spec = self.spec()
        if spec.fault in _VALUE_FAULTS or not spec.hits(group) or not self._draw(spec):
            return run()
        self._note(spec, method, keys, raised=spec.fault != "latency")
        if spec.fault == "latency":
            time.sleep(spec.ms / 1000)
            return run()
        if spec.fault == "enospc":
            cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise StoreError(f"faulty store {self.name!r}: write failed: {cause}") from cause
        kind = StoreUnavailable if spec.error == "unavailable" else StoreError
        raise kind(f"faulty store {self.name!r}: injected {method} failure")

    def _spoil(self, method: str, key: bytes, value: bytes | None) -> bytes | None:
        """A value read, after the value-level faults (corrupt, truncate, evict)."""
        spec = self.spec()
        if value is None or spec.fault not in _VALUE_FAULTS or not spec.hits("get"):
            return value
        if not self._draw(spec):
            return value
        self._note(spec, method, 1, raised=False)
        if spec.fault == "evict":
            self.inner.delete(key)
            return None
        if spec.fault == "truncate":
            return value[: int(len(value) * spec.keep)]
        spoiled = bytearray(value)
        spoiled[len(spoiled) // 2] ^= 0xFF
        return bytes(spoiled)

    # -- the store contract ------------------------------------------------------

    def put(self, key: bytes, value: bytes) -> bool:
        """``inner.put``, unless a write fault hits."""
        return self._call("put", "put", 1, lambda: self.inner.put(key, value))

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """``inner.put_many``, unless a write fault hits."""
        return self._call("put", "put_many", len(items), lambda: self.inner.put_many(items))

    def put_many_parts(self, items: Sequence[tuple[bytes, ValueParts]]) -> list[bool]:
        """``inner.put_many_parts``, unless a write fault hits."""
        run = partial(self.inner.put_many_parts, items)
        return self._call("put", "put_many_parts", len(items), run)

    def get(self, key: bytes) -> bytes | None:
        """``inner.get``, then maybe spoiled."""
        value = self._call("get", "get", 1, lambda: self.inner.get(key))
        return self._spoil("get", key, value)

    def get_into(self, key: bytes, buffer: bytearray) -> bytes | memoryview | None:
        """``inner.get_into``, then maybe spoiled (a spoiled value comes as bytes of its own)."""
        value = self._call("get", "get_into", 1, lambda: self.inner.get_into(key, buffer))
        spoiled = self._spoil("get_into", key, None if value is None else bytes(value))
        return value if spoiled == value else spoiled  # unspoiled: the view itself

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``inner.get_many``, then each value maybe spoiled."""
        values = self._call("get", "get_many", len(keys), lambda: self.inner.get_many(keys))
        return [self._spoil("get_many", k, v) for k, v in zip(keys, values, strict=True)]

    def head(self, key: bytes, size: int) -> bytes | None:
        """``inner.head``, then maybe spoiled."""
        value = self._call("get", "head", 1, lambda: self.inner.head(key, size))
        return self._spoil("head", key, value)

    def head_many(self, keys: Sequence[bytes], size: int) -> list[bytes | None]:
        """``inner.head_many``, then each value maybe spoiled."""
        values = self._call("get", "head_many", len(keys), lambda: self.inner.head_many(keys, size))
        return [self._spoil("head_many", k, v) for k, v in zip(keys, values, strict=True)]

    def walk(self, min_age: float | None = None) -> list[StoredEntry]:
        """``inner.walk``, unless a lookup fault hits."""
        return self._call("lookup", "walk", 0, lambda: list(self.inner.walk(min_age)))

    def contains(self, key: bytes) -> bool:
        """``inner.contains``, unless a lookup fault hits."""
        return self._call("lookup", "contains", 1, lambda: self.inner.contains(key))

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """``inner.contains_many``, unless a lookup fault hits."""
        return self._call(
            "lookup", "contains_many", len(keys), lambda: self.inner.contains_many(keys)
        )

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        """``inner.count_prefix``, unless a lookup fault hits."""
        return self._call(
            "lookup", "count_prefix", len(keys), lambda: self.inner.count_prefix(keys)
        )

    def delete(self, key: bytes) -> None:
        """``inner.delete``, unless a write fault hits."""
        self._call("delete", "delete", 1, lambda: self.inner.delete(key))

    def delete_many(self, keys: Sequence[bytes]) -> None:
        """``inner.delete_many``, unless a write fault hits."""
        self._call("delete", "delete_many", len(keys), lambda: self.inner.delete_many(keys))

    def clear(self) -> None:
        """``inner.clear``, unless a write fault hits."""
        self._call("delete", "clear", 0, self.inner.clear)

    def read_generation(self) -> bytes | None:
        """``inner.read_generation``, unless a lookup fault hits."""
        return self._call("lookup", "read_generation", 0, self.inner.read_generation)

    def write_generation(self, record: bytes) -> None:
        """``inner.write_generation``, unless a write fault hits."""
        self._call("delete", "write_generation", 0, lambda: self.inner.write_generation(record))

    def limit_values(self, nbytes: int) -> None:
        """``inner.limit_values`` (never faulted)."""
        self.inner.limit_values(nbytes)

    def used_bytes(self) -> int:
        """``inner.used_bytes`` (never faulted)."""
        return self.inner.used_bytes()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
