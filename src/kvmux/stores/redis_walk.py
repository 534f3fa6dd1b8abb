"""What operators' tools need of the Redis store: entry names, sizes and ages, no recency.

An entry is the key ``PREFIX{hex}``; its parts (``PREFIX{hex}:nonce:n``) and the
generation key are not entries. A walk SCANs for ``PREFIX{*}`` (every node of a cluster)
and asks per batch, in one pipeline, OBJECT IDLETIME (which never refreshes recency),
then in another, of the entries old enough for the caller, STRLEN and the first bytes,
to tell a split entry's manifest apart and report the entry's whole size. A manifest
written with another ``max_value_size`` (its first part's length tells) stops the walk
with a ConfigError: with the wrong value every split entry would look malformed, and
removing "bad" entries would orphan parts.

Reads refresh an entry's recency in the server's LRU unless the connection has said
CLIENT NO-TOUCH (Redis and Valkey 7.2 on): ``no_touch_hook`` sends it on every new
connection of the tools' client, and is ignored by older servers.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvmux.errors import ConfigError
from kvmux.stores.base import StoredEntry
from kvmux.stores.split import (
    MANIFEST_SIZE,
    Manifest,
    parse_manifest,
    part_name,
    unchecked_manifest,
)

__all__ = [
    "WALK_BATCH",
    "Probed",
    "entry_key",
    "entry_pattern",
    "idle_times",
    "is_old",
    "no_touch_hook",
    "probe",
    "refuse_foreign_split",
]

WALK_BATCH = 500  # names taken from SCAN per pipeline of probes
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_HEX_NAME = re.compile(rb"\{((?:[0-9a-f]{2}){1,64})\}")


def entry_pattern(prefix: str) -> str:
    """The SCAN pattern of entry names under ``prefix`` (glob characters escaped)."""
    return _GLOB_SPECIAL.sub(r"\\\1", prefix) + "{*}"


def entry_key(name: bytes | str, prefix: str) -> bytes | None:
    """The key an entry name holds, or None for a part, the generation or a foreign key."""
    raw = name.encode() if isinstance(name, str) else name
    head = prefix.encode()
    if not raw.startswith(head):
        return None
    match = _HEX_NAME.fullmatch(raw, len(head))
    return bytes.fromhex(match.group(1).decode()) if match else None


def idle_times(pipe: Any, names: Sequence[str]) -> list[float | None]:
    """Seconds each entry has been idle (None: unknown, e.g. under an LFU policy)."""
    for name in names:
        pipe.object("idletime", name)  # never refreshes recency
    return [float(r) if type(r) is int else None for r in pipe.execute(raise_on_error=False)]


def is_old(age: float | None, min_age: float | None) -> bool:
    """Whether an entry of ``age`` is kept by a walk for entries of at least ``min_age``."""
    return min_age is None or age is None or age >= min_age


def probe(
    pipe: Any,
    name_of: Callable[[bytes], str],
    entries: Sequence[tuple[bytes, float | None]],
    limit: int,
) -> list[Probed]:
    """Size (key, age) entries in one pipeline; ``limit`` is the store's max_value_size."""
    for key, _ in entries:  # reads: these refresh recency unless CLIENT NO-TOUCH is on
        pipe.strlen(name_of(key))
        pipe.getrange(name_of(key), 0, MANIFEST_SIZE)  # one byte more than a manifest
    replies = pipe.execute(raise_on_error=False)
    return [
        _probed(key, age, replies[2 * i : 2 * i + 2], limit) for i, (key, age) in enumerate(entries)
    ]


@dataclass(frozen=True)
class Probed:
    """A walked entry, and the manifest it holds if it is not one of this store's."""

    entry: StoredEntry
    foreign: Manifest | None  # manifest-shaped, but not for this max_value_size


def _probed(key: bytes, age: float | None, replies: Sequence[Any], limit: int) -> Probed:
    """An entry from ``probe``'s replies (an error reply: size 0)."""
    length, head = replies
    size = length if type(length) is int else 0  # a key of another type
    if not isinstance(head, bytes):
        return Probed(StoredEntry(key, size, age), None)
    manifest = parse_manifest(head, limit)
    if manifest is not None:
        return Probed(StoredEntry(key, manifest.total, age), None)
    return Probed(StoredEntry(key, size, age), unchecked_manifest(head))


def refuse_foreign_split(
    pipe: Any,
    name_of: Callable[[bytes], str],
    found: Sequence[tuple[bytes, Manifest]],
    max_value_size: int,
) -> None:
    """Raise ConfigError if one of these manifest-shaped entries was split with another size.

    The length of an entry's first part is the size its writer split it with; a manifest
    that is valid for that size is a real entry, not garbage.
    """
    for key, manifest in found:
        pipe.strlen(part_name(name_of(key), manifest.nonce, 1))
    for (key, manifest), length in zip(found, pipe.execute(raise_on_error=False), strict=True):
        if type(length) is int and length > 0 and parse_manifest(manifest.pack(), length):
            raise ConfigError(
                "store.max_value_size",
                f"entry {key.hex()} was split into parts of {length} bytes, not "
                f"{max_value_size}: give the value the tier's engines use",
            )


def no_touch_hook(cluster: bool, response_error: type[Exception]) -> Callable[[Any], None]:
    """A redis-py ``redis_connect_func`` that turns CLIENT NO-TOUCH on where supported."""

    def connect(connection: Any) -> None:
        if not cluster:  # the cluster client runs the usual handshake before this hook
            connection.on_connect()
        connection.send_command("CLIENT", "NO-TOUCH", "ON")
        with contextlib.suppress(response_error):  # before 7.2: reads refresh recency
            connection.read_response()

    return connect
