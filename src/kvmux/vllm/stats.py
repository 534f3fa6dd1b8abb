"""KV-connector stats of both connectors: a tier's counters, and MuxConnector's per child."""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

__all__ = [
    "GAUGES",
    "MUX_COUNTERS",
    "MuxConnectorStats",
    "MuxCounterStats",
    "StoreConnectorStats",
    "connector_path",
]

log = logging.getLogger("kvmux.mux")
GAUGES = frozenset({"breaker_open"})  # maxed, not summed, across workers and intervals
MUX_COUNTERS = "mux"  # MuxConnectorStats' key of its own counters; child labels hold a ":"


def _merge(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    merged = dict(mine)
    for key, value in theirs.items():
        if isinstance(value, dict):
            merged[key] = _merge(merged.get(key, {}), value)
        elif key in GAUGES:
            merged[key] = max(merged.get(key, 0), value)
        elif isinstance(value, int | float):
            merged[key] = merged.get(key, 0) + value
    return merged


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, int | float]:
    flat: dict[str, int | float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        elif isinstance(value, int | float):
            flat[name] = value
    return flat


def _moved(data: dict[str, Any]) -> bool:
    """Whether any counter in ``data`` (nested by label) is nonzero; gauges do not count."""
    for key, value in data.items():
        if isinstance(value, dict):
            if _moved(value):
                return True
        elif value and key not in GAUGES and isinstance(value, int | float):
            return True
    return False


@dataclass
class StoreConnectorStats(KVConnectorStats):
    """One tier's counters for an interval (see kvmux.metrics.TierStats)."""

    def reset(self) -> None:
        """Clear the interval."""
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Sum counters of several workers."""
        self.data = _merge(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        """The interval's counters."""
        return _flatten(self.data)

    def is_empty(self) -> bool:
        """True when nothing moved."""
        return not _moved(self.data)


@dataclass
class MuxCounterStats(StoreConnectorStats):
    """MuxConnector's own counters of each child (calls, errors, breaker), by label."""


def connector_path(cls: type[Any]) -> str:
    """``module:QualName`` of a connector class, as MuxConnectorStats carries it."""
    return f"{cls.__module__}:{cls.__qualname__}"


@cache
def _connector_class(path: str) -> type[KVConnectorBase_V1] | None:
    """The connector class at ``path``; None (logged once) if it is not one."""
    module, _, name = path.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        log.warning("kvmux mux: cannot rebuild the stats of %s: %r", path, exc)
        return None
    if not (isinstance(found, type) and issubclass(found, KVConnectorBase_V1)):
        log.warning("kvmux mux: %s is not a KV connector; its stats are dropped", path)
        return None
    return found


def _registered_class(name: str) -> type[KVConnectorBase_V1] | None:
    """The connector registered with vLLM's factory as ``name``; None (logged) if none."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        found: Any = KVConnectorFactory.get_connector_class_by_name(name)
    except (ValueError, ImportError, AttributeError) as exc:
        log.warning("kvmux mux: cannot rebuild the stats of %s: %r", name, exc)
        return None
    return found if isinstance(found, type) else None


@dataclass
class MuxConnectorStats(KVConnectorStats):
    """Each child's own ``KVConnectorStats`` under its label ("0:memory"), kept by its class.

    ``data[MUX_COUNTERS]`` holds the mux's counters of every child. ``connectors`` names
    each label's connector class, so stats sent as plain dicts (to vLLM's front end) are
    rebuilt by the child's own ``build_kv_connector_stats``.
    """

    connectors: dict[str, str] = field(default_factory=dict)

    def children(self) -> dict[str, KVConnectorStats]:
        """The children's stats objects, by label."""
        return {k: v for k, v in self.data.items() if k != MUX_COUNTERS}

    def counters(self) -> dict[str, dict[str, Any]]:
        """The mux's own counters, by child label."""
        own = self.data.get(MUX_COUNTERS)
        return dict(own.data) if isinstance(own, KVConnectorStats) else {}

    def to_dict(self) -> dict[str, Any]:
        """Plain data: each child's ``to_dict()`` with its connector class, and the counters."""
        payload: dict[str, Any] = {MUX_COUNTERS: self.counters()}
        for label, stats in self.children().items():
            payload[label] = {"connector": self.connectors.get(label), "stats": stats.to_dict()}
        return payload

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> MuxConnectorStats:
        """Rebuild from ``to_dict()`` output (or from objects, in one process)."""
        stats = cls()
        for label, value in data.items():
            if label == MUX_COUNTERS:
                own = value if isinstance(value, KVConnectorStats) else None
                stats.data[label] = own or MuxCounterStats(data=dict(value or {}))
            elif isinstance(value, KVConnectorStats):
                stats.data[label] = value
            elif isinstance(value, dict) and value.get("connector"):
                child_cls = _connector_class(str(value["connector"]))
                stats.rebuild(label, child_cls, value.get("stats"), str(value["connector"]))
            elif isinstance(value, dict):  # MultiConnector's form: the stats of a named child
                name = label.partition(":")[2] or label
                stats.rebuild(label, _registered_class(name), value, name)
        return stats

    def rebuild(self, label: str, child_cls: Any, data: Any, connector: str) -> None:
        """Child ``label``'s stats rebuilt by its class's ``build_kv_connector_stats``."""
        rebuilt = child_cls.build_kv_connector_stats(data=data) if child_cls else None
        if rebuilt is not None:
            self.data[label] = rebuilt
            self.connectors[label] = connector

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Each child's stats aggregated by its own class; the mux's counters summed."""
        for label, theirs in other.data.items():
            mine = self.data.get(label)
            self.data[label] = theirs if mine is None else mine.aggregate(theirs)
        if isinstance(other, MuxConnectorStats):
            self.connectors.update(other.connectors)
        return self

    def reset(self) -> None:
        """Reset every child's stats and the counters."""
        for stats in self.data.values():
            stats.reset()

    def reduce(self) -> dict[str, Any]:
        """Each child's own reduction under its label; the mux's counters under "mux"."""
        reduced: dict[str, Any] = {k: v.reduce() for k, v in self.children().items()}
        own = self.data.get(MUX_COUNTERS)
        if own is not None and not own.is_empty():
            reduced[MUX_COUNTERS] = own.data
        return reduced

    def is_empty(self) -> bool:
        """True when no child and no counter moved."""
        return all(stats.is_empty() for stats in self.data.values())
