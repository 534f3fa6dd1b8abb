"""Redis / Valkey store: one deployment (standalone or cluster) shared by a fleet of engines.

Keys are ``PREFIX{hex}``; an entry larger than ``max_value_size`` is split into parts
``PREFIX{hex}:nonce:1..n`` with a small manifest at ``PREFIX{hex}`` (see ``split``). The
braces are a hash tag, so an entry and its parts live in one cluster slot. Anyone who can
write to the server can write garbage: a malformed manifest, a part of the wrong length,
a value over the store's ``value_limit`` or a key of another type is a miss for that key
(never for the batch it was read in), and reading a split entry sends at most
``split.MAX_PARTS`` commands and reads at most one byte per part more than the manifest's
total. With a ``value_limit`` no reply holds more than that many bytes and one more (a
longer value is read only that far, with GETRANGE); without one, entries are read whole
with GET (``docs/redis_tier_hostile.md``). The entry checksum is verified by the codec as
for every tier. Operators' tools walk the entries (not their parts) with SCAN: see
``redis_walk``.

Every call is bounded by socket timeouts and goes through a circuit breaker: while the
server is down or refusing, calls fail at once (a miss) instead of waiting, and one
trial call per back-off finds out when it is back.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from functools import partial
from itertools import islice
from typing import Any, TypeVar

from kvmux.config import RedisSpec
from kvmux.errors import ConfigError, StoreError, StoreUnavailable
from kvmux.policies.breaker import CircuitBreaker
from kvmux.stores.base import GENERATION_RECORD_MAX, KVStore, StoredEntry, ValueParts
from kvmux.stores.join_buffer import JoinBuffer
from kvmux.stores.redis_walk import (
    WALK_BATCH,
    entry_key,
    entry_pattern,
    idle_times,
    is_old,
    no_touch_hook,
    probe,
    refuse_foreign_split,
)
from kvmux.stores.split import (
    MANIFEST_SIZE,
    Manifest,
    fits,
    is_manifest,
    parse_manifest,
    part_name,
)

__all__ = ["RedisStore", "redis_client"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def _join(parts: list[bytes | None], sizes: list[int]) -> bytes | None:
    """The parts joined, or None unless each has exactly its expected length."""
    if any(part is None or len(part) != size for part, size in zip(parts, sizes, strict=True)):
        return None
    return b"".join(part for part in parts if part is not None)


def _head(parts: list[bytes | None], sizes: list[int]) -> bytes | None:
    """The parts joined up to the first shorter than its size (a missing part reads as
    empty: the head is short, as is the entry); None if one of those is of another type."""
    head: list[bytes] = []
    for part, size in zip(parts, sizes, strict=True):
        if part is None:
            return None
        head.append(part)
        if len(part) < size:
            break
    return b"".join(head)


def _import_redis() -> Any:
    try:
        import redis
        import redis.cluster
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StoreUnavailable("the redis tier needs redis-py: pip install 'kvmux[redis]'") from exc
    return redis


def _client_options(spec: RedisSpec) -> dict[str, Any]:
    redis = _import_redis()
    options: dict[str, Any] = {
        "socket_timeout": spec.socket_timeout,
        "socket_connect_timeout": spec.connect_timeout,
        "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    }
    if spec.username:
        options["username"] = spec.username
    if spec.password_env:
        if spec.password_env not in os.environ:
            raise ConfigError(
                "store.password_env", f"environment variable {spec.password_env} is not set"
            )
        options["password"] = os.environ[spec.password_env]
    for field, option in (
        ("ca_cert", "ssl_ca_certs"),
        ("cert", "ssl_certfile"),
        ("key", "ssl_keyfile"),
    ):
        if getattr(spec, field):
            options[option] = getattr(spec, field)
    return options


def redis_client(spec: RedisSpec) -> Any:
    """A redis-py client of the spec's deployment, with the store's options (tools' use)."""
    redis = _import_redis()
    cls = redis.cluster.RedisCluster if spec.cluster else redis.Redis
    return cls.from_url(spec.url, **_client_options(spec))


class RedisStore(KVStore):
    """Entries in Redis/Valkey; the server's maxmemory policy is the budget."""

    batched_io = True

    def __init__(self, spec: RedisSpec, touch: bool = True):
        self.name = spec.name
        self.capacity = 0  # the server enforces its own maxmemory
        self.spec = spec
        self._redis = _import_redis()
        self._options = _client_options(spec)
        if not touch:  # operators' tools: reads leave the server's LRU order alone (7.2 on)
            response_error = self._redis.exceptions.ResponseError
            self._options["redis_connect_func"] = no_touch_hook(spec.cluster, response_error)
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._breaker = CircuitBreaker(spec.breaker_seconds, max(30.0, spec.breaker_seconds))
        self._failing = False
        self._refusing = False  # logged a refused write since the last accepted one
        self._warned_garbage = False  # logged a malformed value under this prefix
        self._errors = self._redis.exceptions
        self._joiner = JoinBuffer()  # saves' pieces joined into reused memory

    # -- plumbing -------------------------------------------------------------

    def _connect(self) -> Any:
        with self._client_lock:
            if self._client is None:
                if self.spec.cluster:
                    cls = self._redis.cluster.RedisCluster
                    self._client = cls.from_url(self.spec.url, **self._options)
                else:
                    self._client = self._redis.Redis.from_url(self.spec.url, **self._options)
            return self._client

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        if not self._breaker.allow():
            raise StoreUnavailable(f"redis store {self.name!r}: server marked down, retrying later")
        try:
            result = fn(self._connect())
        except (
            self._errors.ConnectionError,
            self._errors.TimeoutError,
            self._errors.ClusterError,
        ) as exc:
            self._breaker.record_failure()
            if not self._failing:
                self._failing = True
                log.warning(
                    "kvmux redis %s: %s failed (%s); serving misses until it is back",
                    self.name,
                    what,
                    exc,
                )
            raise StoreUnavailable(f"redis store {self.name!r}: {what} failed: {exc}") from exc
        except self._errors.RedisError as exc:
            raise StoreError(f"redis store {self.name!r}: {what} failed: {exc}") from exc
        if self._failing:
            self._failing = False
            log.warning("kvmux redis %s: server reachable again", self.name)
        self._breaker.record_success()
        return result

    def _key(self, key: bytes) -> str:
        return f"{self.spec.key_prefix}{{{key.hex()}}}"

    def _set_args(self) -> dict[str, Any]:
        return {"ex": self.spec.ttl_seconds} if self.spec.ttl_seconds else {}

    def _pipeline(self, client: Any) -> Any:
        return client.pipeline(transaction=False)

    # -- the store contract -----------------------------------------------------

    def put(self, key: bytes, value: bytes) -> bool:
        """Store one entry (split into parts past ``max_value_size``)."""
        return self.put_many([(key, value)]) == [True]

    def put_many(self, items: Sequence[tuple[bytes, bytes | memoryview]]) -> list[bool]:
        """Store several entries in one pipelined round trip; False where refused or too large."""

        def run(client: Any) -> list[bool]:
            pipe = self._pipeline(client)
            sizes = [self._queue_put(pipe, self._key(key), value) for key, value in items]
            replies = iter(pipe.execute(raise_on_error=False) if any(sizes) else [])
            stored, accepted = [], True
            for size in sizes:
                outcome = [next(replies) for _ in range(size)]
                refused = [r for r in outcome if isinstance(r, Exception)]
                if refused:
                    self._warn_refused(refused[0])
                    accepted = False
                stored.append(size > 0 and not refused)
            if accepted:
                self._refusing = False
            return stored

        return self._call("put", run) if items else []

    def put_many_parts(self, items: Sequence[tuple[bytes, ValueParts]]) -> list[bool]:
        """``put_many`` of values given as pieces, joined into reused memory (``JoinBuffer``):
        one pipelined round trip per buffer's worth."""
        stored: list[bool] = []
        with closing(self._joiner.batches(items)) as batches:  # a failure frees the buffer
            for batch in batches:
                stored += self.put_many(batch)
        return stored

    def _warn_refused(self, error: Exception) -> None:
        if not self._refusing:
            self._refusing = True
            log.warning(
                "kvmux redis %s: server refused a write (%s); dropping saves", self.name, error
            )

    def _queue_put(self, pipe: Any, name: str, value: bytes | memoryview) -> int:
        """Queue the commands that store one entry; returns how many (0: too large)."""
        limit, args = self.spec.max_value_size, self._set_args()
        if len(value) <= limit:
            pipe.set(name, value, **args)
            return 1
        if not fits(len(value), limit):
            return 0
        view = memoryview(value)
        parts = [view[i : i + limit] for i in range(0, len(value), limit)]
        nonce = os.urandom(16)  # concurrent writers of one key never mix their parts
        for index, part in enumerate(parts, start=1):
            pipe.set(part_name(name, nonce, index), part.tobytes(), **args)
        pipe.set(name, Manifest(len(parts), len(value), nonce).pack(), **args)
        return len(parts) + 1

    def get(self, key: bytes) -> bytes | None:
        """One entry, reassembled from its parts if it was split."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Several entries in one pipelined round trip (two if some were split)."""

        def run(client: Any) -> list[bytes | None]:
            limit, pipe = self.value_limit, self._pipeline(client)
            for key in keys:
                self._queue_get(pipe, self._key(key), limit)
            values = self._got(pipe.execute(raise_on_error=False), limit)
            split = self._manifests(values, limit)
            if split:
                self._reassemble(client, keys, values, split)
            return values

        return self._call("get", run) if keys else []

    def _queue_get(self, pipe: Any, name: str, limit: int | None) -> None:
        """Queue the read of one entry: GET, or at most ``limit`` bytes and one more."""
        if limit is None:
            pipe.get(name)
            return
        pipe.exists(name)  # GETRANGE of an absent key is empty, as of an empty value
        pipe.getrange(name, 0, max(limit, MANIFEST_SIZE))  # a manifest is read whole

    def _got(self, replies: list[Any], limit: int | None) -> list[bytes | None]:
        """The values in the replies to ``_queue_get``; None where absent or unfit."""
        if limit is None:
            return [self._value(reply) for reply in replies]
        pairs = zip(replies[::2], replies[1::2], strict=True)
        return [self._bounded(found, head, limit) for found, head in pairs]

    def _bounded(
        self, found: Any, head: Any, limit: int | None, length: Any = None
    ) -> bytes | None:
        """A value read as EXISTS and GETRANGE: None if absent, of another type, or longer
        than ``limit`` (its length: ``length``, a STRLEN reply, else the bytes read)."""
        value = self._value(head) if found == 1 else None
        if value is None or limit is None:
            return value
        size = len(value) if length is None else length
        if type(size) is int and size <= limit:
            return value
        if size == MANIFEST_SIZE and is_manifest(value):
            return value  # a manifest's total is weighed against the limit when parsed
        self._warn_garbage("a value over the size limit")
        return None

    def _value(self, reply: Any) -> bytes | None:
        """A GET-like reply: None for a key of another type (garbage), raised if an error."""
        if isinstance(reply, self._errors.ResponseError) and str(reply).startswith("WRONGTYPE"):
            self._warn_garbage("a key of another type")
            return None
        if isinstance(reply, Exception):
            raise reply
        return reply if isinstance(reply, bytes) else None

    def _manifests(self, values: list[bytes | None], limit: int | None) -> dict[int, Manifest]:
        """The valid manifest of each split entry, by position; malformed ones (or of an
        entry over ``limit``) become None."""
        found = {}
        for i, value in enumerate(values):
            if value is None or not is_manifest(value):
                continue
            manifest = parse_manifest(value, self.spec.max_value_size, limit)
            if manifest is None:
                self._warn_garbage("a malformed manifest")
                values[i] = None
            else:
                found[i] = manifest
        return found

    def _reassemble(
        self,
        client: Any,
        keys: Sequence[bytes],
        values: list[bytes | None],
        split: dict[int, Manifest],
    ) -> None:
        """Read every part; asking one byte more than its length tells a longer part apart."""
        pipe = self._pipeline(client)
        sizes = {i: manifest.part_sizes(self.spec.max_value_size) for i, manifest in split.items()}
        for i, manifest in split.items():
            name = self._key(keys[i])
            for index, size in enumerate(sizes[i], start=1):
                pipe.getrange(part_name(name, manifest.nonce, index), 0, size)
        replies = iter(pipe.execute(raise_on_error=False))
        for i in split:
            values[i] = _join([self._value(next(replies)) for _ in sizes[i]], sizes[i])

    def _warn_garbage(self, what: str) -> None:
        if not self._warned_garbage:
            self._warned_garbage = True
            log.warning(
                "kvmux redis %s: found %s under %r; treated as a miss",
                self.name,
                what,
                self.spec.key_prefix,
            )

    def contains(self, key: bytes) -> bool:
        """One EXISTS."""
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """EXISTS for every key, in one pipelined round trip."""

        def run(client: Any) -> list[bool]:
            pipe = self._pipeline(client)
            for key in keys:
                pipe.exists(self._key(key))
            return [bool(n) for n in pipe.execute()]

        return self._call("lookup", run) if keys else []

    def count_prefix(self, keys: Sequence[bytes]) -> int:
        """Consecutive present keys from the first, in one round trip."""
        present = self.contains_many(keys)
        return next((i for i, hit in enumerate(present) if not hit), len(present))

    def delete(self, key: bytes) -> None:
        """Remove an entry and, if its manifest is valid, its parts."""
        self.delete_many([key])

    def delete_many(self, keys: Sequence[bytes]) -> None:
        """Remove entries and their parts in two pipelined round trips."""

        def run(client: Any) -> None:
            pipe = self._pipeline(client)
            for key in keys:  # one byte more than a manifest tells a longer value apart
                pipe.getrange(self._key(key), 0, MANIFEST_SIZE)
            heads = [self._value(reply) for reply in pipe.execute(raise_on_error=False)]
            pipe = self._pipeline(client)
            for key, head in zip(keys, heads, strict=True):
                name = self._key(key)
                manifest = parse_manifest(head, self.spec.max_value_size) if head else None
                if manifest is not None:
                    for index in range(1, manifest.count + 1):
                        pipe.delete(part_name(name, manifest.nonce, index))
                pipe.delete(name)
            pipe.execute()

        if keys:
            self._call("delete", run)

    # -- operators' tools -------------------------------------------------------

    def walk(self, min_age: float | None = None) -> Iterator[StoredEntry]:
        """Every entry (not its parts) once: SCAN on every node, then ages and sizes.

        Entries idle for less than ``min_age`` are left out before anything reads them.
        """
        prefix = self.spec.key_prefix
        names = self._call("scan", lambda c: c.scan_iter(match=entry_pattern(prefix), count=1000))
        seen: set[bytes] = set()  # SCAN may return a name twice
        while batch := self._call("scan", lambda _: list(islice(names, WALK_BATCH))):
            named = dict.fromkeys(entry_key(name, prefix) for name in batch)  # in SCAN's order
            keys = [key for key in named if key is not None and key not in seen]
            seen.update(keys)
            if keys:
                yield from self._call("walk", partial(self._probe, keys, min_age))

    def _probe(self, keys: list[bytes], min_age: float | None, client: Any) -> list[StoredEntry]:
        ages = idle_times(self._pipeline(client), [self._key(key) for key in keys])
        old = [(k, a) for k, a in zip(keys, ages, strict=True) if is_old(a, min_age)]
        if not old:
            return []
        probed = probe(self._pipeline(client), self._key, old, self.spec.max_value_size)
        foreign = [(p.entry.key, p.foreign) for p in probed if p.foreign is not None]
        if foreign:
            refuse_foreign_split(
                self._pipeline(client), self._key, foreign, self.spec.max_value_size
            )
        return [p.entry for p in probed]

    def head_many(self, keys: Sequence[bytes], size: int) -> list[bytes | None]:
        """The first ``size`` bytes of entries (from their first parts if split)."""

        def run(client: Any) -> list[bytes | None]:
            limit, pipe = self.value_limit, self._pipeline(client)
            wanted = size if limit is None else min(size, limit)  # a longer entry is a miss
            for key in keys:  # GETRANGE of an absent key is empty: EXISTS tells them apart
                pipe.exists(self._key(key))
                pipe.strlen(self._key(key))
                pipe.getrange(self._key(key), 0, max(wanted, MANIFEST_SIZE + 1) - 1)
            replies = pipe.execute(raise_on_error=False)
            triples = zip(replies[::3], replies[1::3], replies[2::3], strict=True)
            heads = [self._bounded(found, head, limit, n) for found, n, head in triples]
            split = self._manifests(heads, limit)
            if split:
                self._read_heads(client, keys, heads, split, size)
            return [None if head is None else head[:size] for head in heads]

        return self._call("head", run) if keys else []

    def _read_heads(
        self,
        client: Any,
        keys: Sequence[bytes],
        heads: list[bytes | None],
        split: dict[int, Manifest],
        size: int,
    ) -> None:
        """Replace each manifest by the first ``size`` bytes of its parts."""
        pipe, wanted = self._pipeline(client), {}
        for i, manifest in split.items():
            wanted[i] = manifest.head_sizes(self.spec.max_value_size, size)
            for index, length in enumerate(wanted[i], start=1):
                pipe.getrange(part_name(self._key(keys[i]), manifest.nonce, index), 0, length - 1)
        replies = iter(pipe.execute(raise_on_error=False))
        for i in split:
            heads[i] = _head([self._value(next(replies)) for _ in wanted[i]], wanted[i])

    def read_generation(self) -> bytes | None:
        """The record under ``<key_prefix>generation`` (its first ``GENERATION_RECORD_MAX +
        1`` bytes), or None if absent, empty or of another type (no record: replaced)."""
        value = self._call("generation", self._read_generation)
        if not isinstance(value, bytes):
            return None
        return value or None

    def _read_generation(self, client: Any) -> Any:
        try:
            return client.getrange(self._generation_key, 0, GENERATION_RECORD_MAX)
        except self._errors.ResponseError as exc:  # WRONGTYPE: a writer put a list there
            if "WRONGTYPE" not in str(exc):
                raise
            return None

    def write_generation(self, record: bytes) -> None:
        """SET the record: every engine using this prefix follows it."""
        self._call("generation", lambda client: client.set(self._generation_key, record))

    @property
    def _generation_key(self) -> str:
        return f"{self.spec.key_prefix}generation"

    def used_bytes(self) -> int:
        """The server's used memory (all nodes in a cluster)."""

        def run(client: Any) -> int:
            info = client.info("memory")
            if self.spec.cluster and all(isinstance(v, dict) for v in info.values()):
                return sum(int(v.get("used_memory", 0)) for v in info.values())
            return int(info.get("used_memory", 0))

        return self._call("info", run)

    def clear(self) -> None:
        """Remove every key under this store's prefix."""

        def run(client: Any) -> None:
            pipe = self._pipeline(client)
            for name in client.scan_iter(match=f"{self.spec.key_prefix}*", count=1000):
                pipe.delete(name)
            pipe.execute()

        self._call("clear", run)

    def close(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            self._client.close()
