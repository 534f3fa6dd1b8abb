"""A StoreConnector whose store (on both halves) is wrapped in a FaultyStore.

A memory tier has no byte store: its worker's slot copies consult the same control
file (``tests.support.faulty_slab``).

Configured like StoreConnector, plus one key of its own naming the control file:

    {"store": {...}, "faults": "/path/to/control.json"}

StoreConnector refuses unknown keys, so ``faults`` is taken out of a copy of the
KV transfer config before StoreConnector parses it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvmux.config import MemorySpec, StoreConnectorConfig, StoreSpec
from kvmux.stores import KVStore
from kvmux.tier.worker.slab_worker import SlabWorker
from kvmux.vllm.engine_config import prefer_recompute
from kvmux.vllm.store_connector import StoreConnector
from tests.support.faulty_slab import FaultySlabWorker
from tests.support.faulty_store import FaultyStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

CONTROL_KEY = "faults"


class FaultyStoreConnector(StoreConnector):
    """StoreConnector over FaultyStore(real store, control file)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        ktc = vllm_config.kv_transfer_config
        assert ktc is not None
        extra = dict(ktc.kv_connector_extra_config or {})
        control = extra.pop(CONTROL_KEY, None)
        if not isinstance(control, str) or not control:
            raise ValueError(f"FaultyStoreConnector needs {CONTROL_KEY!r}: a control file path")
        self.control = control
        own = copy.copy(vllm_config)  # the engine's config keeps its own extra config
        own.kv_transfer_config = dataclasses.replace(ktc, kv_connector_extra_config=extra)
        super().__init__(own, role, kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:  # StoreConnector set it on the copy only
            prefer_recompute(ktc, self.config.fail_on_load_error)

    @classmethod
    def parse_extra_config(cls, extra_config: Any) -> StoreConnectorConfig:
        """StoreConnector's parse, less this connector's own key."""
        extra = dict(extra_config or {})
        extra.pop(CONTROL_KEY, None)
        return super().parse_extra_config(extra)

    def open_slab_worker(self, spec: MemorySpec, slots: int) -> SlabWorker:
        """The memory tier's worker, behind the control file's faults."""
        return FaultySlabWorker(spec.name, slots, 0, self.stats, self.control)

    def open_store(self, spec: StoreSpec) -> KVStore:
        """The real store, behind the control file's faults."""
        return FaultyStore(super().open_store(spec), self.control)
