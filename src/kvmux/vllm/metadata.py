"""What the connectors send between their halves each step (vLLM metadata objects)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvmux.keys import BlockKey
from kvmux.mux.plan import MuxStepPlan
from kvmux.tier.scheduler.plan import TierStepPlan

__all__ = ["MuxMetadata", "MuxWorkerMetadata", "StoreConnectorMetadata", "StoreWorkerMetadata"]


@dataclass
class StoreConnectorMetadata(KVConnectorMetadata):
    """The step plan, sent from the scheduler to every worker."""

    plan: TierStepPlan = field(default_factory=TierStepPlan)


@dataclass
class StoreWorkerMetadata(KVConnectorWorkerMetadata):
    """Keys the workers could not load, and where asynchronous loads failed, for the scheduler."""

    missing: set[BlockKey] = field(default_factory=set)
    failed_loads: dict[str, int] = field(default_factory=dict)  # request -> first failed position

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        """Union of the missing keys of several workers; each request's earliest failure."""
        assert isinstance(other, StoreWorkerMetadata)
        failed = dict(self.failed_loads)
        for req_id, position in other.failed_loads.items():
            failed[req_id] = min(position, failed.get(req_id, position))
        return StoreWorkerMetadata(self.missing | other.missing, failed)


@dataclass
class MuxMetadata(KVConnectorMetadata):
    """Each child's metadata in order (None: the child is skipped), plus the mux's plan."""

    children: tuple[KVConnectorMetadata | None, ...]
    plan: MuxStepPlan = field(default_factory=MuxStepPlan)


@dataclass
class MuxWorkerMetadata(KVConnectorWorkerMetadata):
    """Each child's worker metadata in order, plus children whose worker breaker is open."""

    children: tuple[KVConnectorWorkerMetadata | None, ...]
    open_children: frozenset[int] = frozenset()

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        """Combine child by child."""
        assert isinstance(other, MuxWorkerMetadata)
        merged = tuple(
            a if b is None else b if a is None else a.aggregate(b)
            for a, b in zip(self.children, other.children, strict=True)
        )
        return MuxWorkerMetadata(merged, self.open_children | other.open_children)
