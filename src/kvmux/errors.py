"""The one exception tree of kvmux.

    KvmuxError
     +-- ConfigError        bad configuration; names the key and the accepted values
     +-- StoreError         a store could not do what was asked (I/O, network, permissions)
     |    +-- StoreUnavailable   the store cannot be reached or opened at all
     +-- CorruptEntry       stored bytes failed header or checksum verification
     |    +-- UnverifiedEntry    signing is on and the entry has no valid signature
     +-- UnkeyableInput     a request input kvmux cannot key safely: the request is not cached

Errors from libraries (OSError, redis errors, ...) are translated at the boundary
with ``raise ... from exc``. Inside the connectors a StoreError or CorruptEntry is a
cache miss: counted, logged, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ConfigError",
    "CorruptEntry",
    "KvmuxError",
    "StoreError",
    "StoreUnavailable",
    "UnkeyableInput",
    "UnsupportedLayout",
    "UnverifiedEntry",
]


class KvmuxError(Exception):
    """Base class of every error kvmux raises."""


class ConfigError(KvmuxError, ValueError):
    """A configuration value is missing, unknown or malformed."""

    def __init__(self, key: str, problem: str, accepted: Iterable[str] | str | None = None):
        self.key = key
        self.problem = problem
        if accepted is None:
            self.accepted = ""
        elif isinstance(accepted, str):
            self.accepted = accepted
        else:
            self.accepted = ", ".join(sorted(accepted))
        message = f"kvmux config key {key!r}: {problem}"
        if self.accepted:
            message += f" (accepted: {self.accepted})"
        super().__init__(message)


class StoreError(KvmuxError):
    """A store operation failed."""


class StoreUnavailable(StoreError):
    """The store cannot be opened or reached."""


class CorruptEntry(KvmuxError):
    """Stored bytes are truncated, malformed or fail their checksum."""


class UnkeyableInput(KvmuxError):
    """A request input kvmux cannot put into a key; such a request is not cached."""


class UnverifiedEntry(CorruptEntry):
    """Signing is on and an entry is unsigned, signed with an unknown key, or forged."""


class UnsupportedLayout(KvmuxError, ValueError):
    """A KV cache tensor is laid out in a way kvmux does not know how to index by block."""
