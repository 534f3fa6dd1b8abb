"""Write docs/configuration-reference.md from the config parser, so the page cannot drift.

usage: python -m kvmux.tools.config_reference [--check] [OUT]

The keys come from the parser itself: each level's accepted keys are read from the error it
raises for an unknown key, and each default from what it parses a minimal config into. Only
the meaning of each key is written here (``STORE``, ``CONNECTOR``, ``MUX``, ``SIGNING``); a
key the parser accepts without an entry there is an error, so a new key needs its words
before the page builds. ``--check`` compares the page with OUT instead of writing it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

from kvmux.config import (
    ASYNC_LOADS,
    INHERITED,
    POLICIES,
    parse_capacity,
    parse_mux_config,
    parse_store_connector_config,
    parse_store_spec,
)
from kvmux.errors import ConfigError

__all__ = ["Key", "accepted_keys", "main", "render", "store_types"]

DEFAULT_OUT = Path("docs/configuration-reference.md")
_PROBE = "\x00probe"  # a key no parser accepts: its error lists the accepted ones
_GIB = "1GiB"


@dataclass(frozen=True)
class Key:
    """What the page says of one key besides its default, which comes from the parser."""

    meaning: str
    accepted: str
    default: str | None = None  # the default as a user writes it, where the parsed one is not


def _rejected(call: Callable[[], object]) -> ConfigError:
    try:
        call()
    except ConfigError as exc:
        return exc
    raise AssertionError("the parser accepted a config it should refuse")


def _names(exc: ConfigError) -> frozenset[str]:
    return frozenset(name.strip() for name in exc.accepted.split(","))


def store_types() -> tuple[str, ...]:
    """The store types ``parse_store_spec`` accepts, as its error for an unknown one lists."""
    exc = _rejected(lambda: parse_store_spec({"type": _PROBE}))
    return tuple(sorted(_names(exc)))


def _minimal_store(kind: str) -> dict[str, Any]:
    required = {
        "memory": {"capacity": _GIB},
        "disk": {"path": "/var/cache/kvmux", "capacity": _GIB},
        "redis": {"url": "redis://localhost:6379/0"},
    }
    return {"type": kind, **required[kind]}


def accepted_keys() -> dict[str, frozenset[str]]:
    """Every level's accepted keys, read from the parser's refusal of an unknown key."""
    levels: dict[str, frozenset[str]] = {
        "StoreConnector": _names(_rejected(lambda: parse_store_connector_config({_PROBE: 1}))),
        "MuxConnector": _names(_rejected(lambda: parse_mux_config({_PROBE: 1}, {}))),
    }
    for kind in store_types():
        levels[kind] = _names(_rejected(partial(parse_store_spec, {"type": kind, _PROBE: 1})))
    signed = {**_minimal_store("memory"), "signing": {_PROBE: "x"}}
    levels["signing"] = _names(_rejected(lambda: parse_store_spec(signed)))
    return levels


_CAPACITY = _rejected(lambda: parse_capacity("?", "capacity")).accepted
_CHOICES = ", ".join

STORE: dict[str, Key] = {
    "type": Key("the kind of tier", _CHOICES(f"`{t}`" for t in store_types())),
    "name": Key(
        "label of the tier in logs, stats, metrics and KV events; two tiers of one "
        "MuxConnector need different names",
        "1 to 64 letters, digits, `_`, `.`, `-`",
    ),
    "capacity": Key(
        "byte budget of the tier: a memory tier allocates it at start and never exceeds it; "
        "a disk tier evicts its oldest entries past it",
        _CAPACITY,
    ),
    "path": Key(
        "directory of the entries (created 0700 if missing; `~` is expanded); several "
        "engines may share it",
        "a directory path",
    ),
    "direct_writes": Key(
        "write entries of 64 KiB and more around the page cache (`O_DIRECT`); reads go "
        "through the page cache either way (see [Disk tier](design/disk-tier.md))",
        "`true`, `false`",
    ),
    "url": Key(
        "the Redis or Valkey server; may carry `user:password@`",
        "`redis://host:port/db`, `rediss://` (TLS), `unix://path`",
    ),
    "cluster": Key(
        "Redis Cluster mode: give any node's URL, the client discovers the others and "
        "follows MOVED/ASK",
        "`true`, `false`",
    ),
    "key_prefix": Key("every key starts with it", "a string without `{` or `}`"),
    "ttl_seconds": Key(
        "expire entries this long after they are written", "a positive integer", "never"
    ),
    "socket_timeout": Key("seconds one operation may take", "a positive number"),
    "connect_timeout": Key("seconds one connect may take", "a positive number"),
    "max_value_size": Key(
        "larger entries are split into parts (at most 4096, and 1 GiB in all); engines "
        "sharing a server must use the same value",
        _CAPACITY,
    ),
    "username": Key("ACL user (overrides the URL's)", "a non-empty string", "the URL's"),
    "password_env": Key(
        "name of an environment variable holding the password (keeps it off the command line)",
        "a non-empty string",
    ),
    "ca_cert": Key("TLS: CA bundle path", "a non-empty string"),
    "cert": Key("TLS: client certificate path", "a non-empty string"),
    "key": Key("TLS: client key path", "a non-empty string"),
    "lookup_wait": Key(
        "seconds the scheduler waits for a lookup before answering vLLM \u201cask again\u201d",
        "a positive number",
    ),
    "breaker_seconds": Key(
        "first back-off after the server failed (doubles per failure, up to 30 s)",
        "a positive number",
    ),
    "save_queue": Key(
        "host bytes of saves copied out of the KV cache and not yet written; `auto` follows "
        "the engine (see [Configuration](guide/configuration.md#the-save-queue))",
        f"`auto` or {_CAPACITY}",
        '`"auto"`',
    ),
    "async_loads": Key(
        "whether loads run off the forward path: `auto` is asynchronous for disk and Redis, "
        "synchronous for memory (a model with several KV cache groups always loads "
        "asynchronously)",
        _CHOICES(f"`{v}`" for v in ASYNC_LOADS),
    ),
    "offload_prompt_only": Key(
        "save the prompt's full blocks only; `false` saves generated blocks too (a request "
        "may override it with `kv_transfer_params`)",
        "`true`, `false`",
    ),
    "epoch": Key(
        "the operator's label of what is stored, folded into every key: a new epoch serves "
        "nothing stored under another",
        "text of 0 to 128 characters",
    ),
    "signing": Key(
        "sign every saved entry and verify every loaded one (see "
        "[Signed entries](design/signed-entries.md))",
        "a mapping with one of the keys below",
        "unsigned",
    ),
}

SIGNING: dict[str, Key] = {
    "key_env": Key(
        "name of an environment variable holding the keys, read at engine start",
        "lines or comma-separated entries of `id:hexsecret`, secrets of 16 bytes or more",
        "one of the two",
    ),
    "key_file": Key(
        "path of a file holding the keys, read at engine start",
        "lines or comma-separated entries of `id:hexsecret`; `#` starts a comment",
        "one of the two",
    ),
}

CONNECTOR: dict[str, Key] = {
    "store": Key("the one tier this connector reads and writes", "a store spec (below)"),
    "fail_on_load_error": Key(
        "kvmux sets vLLM's `kv_load_failure_policy` to `recompute`; `true` keeps vLLM's "
        "`fail` policy",
        "`true`, `false`",
    ),
}

MUX: dict[str, Key] = {
    "tiers": Key(
        "kvmux store specs, each one a StoreConnector child, fastest first",
        "a list of store specs",
        "`[]`",
    ),
    "connectors": Key(
        "other children, exactly as vLLM's MultiConnector takes them (any vLLM connector by "
        "name, or one with `kv_connector_module_path`)",
        "a list of KVTransferConfig mappings",
        "`[]`",
    ),
    "policy": Key(
        "which children load a request (see [MuxConnector](guide/mux.md#policies))",
        _CHOICES(f"`{p}`" for p in POLICIES),
    ),
    "breaker_seconds": Key(
        "how long a child that raised is skipped; doubles per consecutive failure",
        "a positive number",
    ),
    "breaker_max_seconds": Key("cap of that back-off", "a positive number"),
    "fail_on_load_error": CONNECTOR["fail_on_load_error"],
}

# The order keys are listed in; keys of a level not named here follow, sorted.
_ORDER = (
    "store",
    "tiers",
    "connectors",
    "policy",
    "type",
    "name",
    "capacity",
    "path",
    "url",
    "direct_writes",
    "cluster",
    "username",
    "password_env",
    "ca_cert",
    "cert",
    "key",
    "key_prefix",
    "ttl_seconds",
    "socket_timeout",
    "connect_timeout",
    "max_value_size",
    "lookup_wait",
    "breaker_seconds",
)
_COMMON = ("save_queue", "async_loads", "offload_prompt_only", "epoch", "signing")
_REQUIRED = object()


def _ordered(keys: Iterable[str]) -> list[str]:
    rank = {k: i for i, k in enumerate(_ORDER)}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), k))


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value else "none"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int) and value >= 2**20 and value % 2**20 == 0:
        return f"`{value // 2**20}MiB`"
    return f"`{value}`"


def _defaults(parsed: Any, required: Iterable[str]) -> dict[str, object]:
    """Each field's parsed default, by name; the keys a minimal config had to give are required."""
    out: dict[str, object] = {f.name: getattr(parsed, f.name) for f in fields(parsed)}
    out.update(dict.fromkeys(required, _REQUIRED))
    return out


def _table(keys: Iterable[str], words: Mapping[str, Key], defaults: Mapping[str, object]) -> str:
    rows = ["| key | default | accepted values | meaning |", "|---|---|---|---|"]
    for key in keys:
        if key not in words:
            raise KeyError(f"the parser accepts {key!r}, which has no description here")
        entry = words[key]
        default = defaults.get(key, _REQUIRED)
        if default is _REQUIRED:
            shown = "required"
        elif entry.default is not None:
            shown = entry.default
        else:
            shown = _value(default)
        rows.append(f"| `{key}` | {shown} | {entry.accepted} | {entry.meaning} |")
    return "\n".join(rows)


def render() -> str:
    """The whole page."""
    levels = accepted_keys()
    types = store_types()
    parts = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m kvmux.tools.config_reference` from src/kvmux/config.py;"
        " do not edit by hand. -->",
        "",
        "Every key the connectors accept in `kv_connector_extra_config`, with its default and "
        "accepted values, as the parser in `kvmux.config` reads them. A key that is not listed "
        "here, a bad value or a missing required key stops the engine at start with one "
        "error naming the key and the accepted values; `kvmux check-config` gives the same "
        "error offline (see [Configuration](guide/configuration.md)).",
        "",
        "## StoreConnector",
        "",
        "`kv_connector_extra_config` of `StoreConnector`:",
        "",
    ]
    store_connector = parse_store_connector_config({"store": _minimal_store("memory")})
    parts.append(
        _table(
            _ordered(levels["StoreConnector"]),
            CONNECTOR,
            _defaults(store_connector, ["store"]),
        )
    )
    parts += [
        "",
        "## Store specs",
        "",
        "A store spec names one tier: the `store` of a StoreConnector, or one item of a "
        f"MuxConnector's `tiers`. Its `type` is one of {_CHOICES(f'`{t}`' for t in types)}.",
        "",
    ]
    common: frozenset[str] | None = None
    for kind in types:
        common = levels[kind] if common is None else common & levels[kind]
    assert common is not None
    shared = [k for k in _COMMON if k in common] + sorted(common - set(_COMMON) - set(_ORDER))
    for kind in types:
        minimal = _minimal_store(kind)
        defaults = _defaults(parse_store_spec(minimal), minimal)
        own = _ordered(levels[kind] - set(shared))
        parts += [f"### `{kind}`", "", _table(own, STORE, defaults), ""]
    memory = _minimal_store("memory")
    parts += [
        "### Keys of every store type",
        "",
        "Every store type also takes these keys, with the same defaults:",
        "",
        _table(shared, STORE, _defaults(parse_store_spec(memory), memory)),
        "",
        "### `signing`",
        "",
        "`signing` takes exactly one of these keys:",
        "",
        _table(_ordered(levels["signing"]), SIGNING, dict.fromkeys(levels["signing"])),
        "",
        "## Capacities",
        "",
        f"`capacity`, `save_queue` and `max_value_size` take {_CAPACITY}: `KiB`, `MiB`, "
        "`GiB`, `TiB` are powers of 1024 and `KB`, `MB`, `GB`, `TB` powers of 1000, e.g. "
        '`"2GiB"`, `"500MB"`.',
        "",
        "## MuxConnector",
        "",
        "`kv_connector_extra_config` of `MuxConnector`:",
        "",
    ]
    tiers = {"tiers": [memory]}
    mux = parse_mux_config(tiers, {})
    mux_defaults = _defaults(mux, [])
    mux_defaults.update({"tiers": [], "connectors": []})  # worded in MUX: one is required
    parts += [
        _table(_ordered(levels["MuxConnector"]), MUX, mux_defaults),
        "",
        "At least one child is required, in `tiers` or `connectors`. Children are ordered "
        "`tiers` first, then `connectors`. Each child inherits these top-level "
        "KVTransferConfig fields unless it sets its own: "
        + _CHOICES(f"`{f}`" for f in INHERITED)
        + ".",
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/configuration-reference.md.")
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run python -m kvmux.tools.config_reference")
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
