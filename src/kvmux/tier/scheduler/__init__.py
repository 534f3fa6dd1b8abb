"""A tier's scheduler side: lookups, step plans and its view of the tier (pure Python, no torch)."""

from kvmux.tier.scheduler.index import MirrorIndex, RemoteStoreView, SharedStoreView, TierView
from kvmux.tier.scheduler.plan import BlockTransfer, RequestLoad, SavedBlock, TierStepPlan
from kvmux.tier.scheduler.scheduler import ScheduledRequest, TierScheduler

__all__ = [
    "BlockTransfer",
    "MirrorIndex",
    "RemoteStoreView",
    "RequestLoad",
    "SavedBlock",
    "ScheduledRequest",
    "SharedStoreView",
    "TierScheduler",
    "TierStepPlan",
    "TierView",
]
