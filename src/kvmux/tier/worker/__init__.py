"""A tier's worker side: the workers that run a step plan and the copies they make (torch)."""

from kvmux.tier.worker.base import RankAgreement, WorkerBase
from kvmux.tier.worker.slab_worker import SlabWorker
from kvmux.tier.worker.store_worker import StoreWorker

__all__ = ["RankAgreement", "SlabWorker", "StoreWorker", "WorkerBase"]
