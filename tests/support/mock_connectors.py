"""Child connectors for the port of vLLM's MultiConnector tests, loaded by vLLM's factory.

Each is named in a child config as ``{"kv_connector": NAME, "kv_connector_module_path":
MODULE}`` (see ``child``):

- ``MockConnector`` / ``MockHMAConnector``: every instance is a ``MagicMock`` specced on
  the base class (on SupportsHMA too for the second), so a test scripts return values and
  checks calls, as vLLM's tests do.
- ``QuietConnector`` and subclasses: real connectors that do nothing; the stats ones hand
  out ``pending_stats`` once from ``get_kv_connector_stats``, and differ in how their class
  rebuilds stats sent as plain data: ``StatsConnector`` as ``MockConnectorStats``,
  ``NixlStatsConnector`` as NixlConnector does (``NixlKVConnectorStats``),
  ``PlainStatsConnector`` not at all (the base class's ``None``, like ExampleConnector).
- ``PromConnector``: a StatsConnector with its own Prometheus counter.
- ``QuietHMAConnector``: a real connector that supports HMA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from unittest.mock import MagicMock

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

__all__ = [
    "MODULE",
    "MockConnector",
    "MockConnectorStats",
    "MockHMAConnector",
    "NixlStatsConnector",
    "PlainStatsConnector",
    "PromConnector",
    "QuietConnector",
    "QuietHMAConnector",
    "StatsConnector",
    "VanishingStatsConnector",
    "child",
    "nixl_data",
]

MODULE = __name__
PROM_COUNTER = "kvmux_test_child_ops"  # PromConnector's counter (exposed with "_total")


def child(name: str, **fields: Any) -> dict[str, Any]:
    """The KVTransferConfig fields of one child connector of this module."""
    return {
        "kv_connector": name,
        "kv_role": "kv_both",
        "kv_connector_module_path": MODULE,
        **fields,
    }


def nixl_data(**lists: list[Any]) -> dict[str, list[Any]]:
    """NixlKVConnectorStats data: every series it keeps, empty unless given."""
    data: dict[str, list[Any]] = {key: [] for key in NixlKVConnectorStats().data}
    data.update(lists)
    return data


@dataclass
class MockConnectorStats(KVConnectorStats):
    """Lists of observations per field; reduces to the count of each."""

    def reset(self) -> None:
        self.data = {key: [] for key in self.data}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, values in other.data.items():
            self.data.setdefault(key, []).extend(values)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: len(values) for key, values in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class _AbstractHooks(KVConnectorBase_V1):
    """The abstract hooks, doing nothing."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()


class MockConnector(_AbstractHooks):
    """Each instance is a MagicMock specced on KVConnectorBase_V1; stats default to None."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        mock = MagicMock(spec_set=KVConnectorBase_V1)
        mock.get_kv_connector_stats.return_value = None
        mock.build_connector_worker_meta.return_value = None
        return mock

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> MockConnectorStats:
        return MockConnectorStats(data=dict(data or {}))


class MockHMAConnector(_AbstractHooks, SupportsHMA):
    """Each instance is a MagicMock specced on this class, so it supports HMA."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        mock = MagicMock(spec_set=cls)
        mock.get_kv_connector_stats.return_value = None
        mock.build_connector_worker_meta.return_value = None
        return mock

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None


class QuietConnector(_AbstractHooks):
    """A real connector that does nothing; hands out ``pending_stats`` once."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.pending_stats: KVConnectorStats | None = None

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        stats, self.pending_stats = self.pending_stats, None
        return stats


class QuietHMAConnector(QuietConnector, SupportsHMA):
    """A real connector that does nothing and supports HMA."""

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return False, None


class StatsConnector(QuietConnector):
    """Its class rebuilds stats data as MockConnectorStats."""

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> MockConnectorStats:
        return MockConnectorStats(data=dict(data or {}))


class NixlStatsConnector(QuietConnector):
    """Its class rebuilds stats data as NixlConnector's class does."""

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> NixlKVConnectorStats:
        return NixlKVConnectorStats(data=data) if data is not None else NixlKVConnectorStats()


class PlainStatsConnector(QuietConnector):
    """Has stats, but its class cannot rebuild them (returns None, like ExampleConnector)."""


class VanishingStatsConnector(StatsConnector):
    """A test removes this class from the module to make its stats' connector unknown."""


class PromChildMetrics(KVConnectorPromMetrics):
    """One counter: the observations of each interval's MockConnectorStats, summed."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter_cls: Any = self._counter_cls
        self.counter = counter_cls(
            name=PROM_COUNTER, documentation="test child operations", labelnames=labelnames
        )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        values = [str(v) for v in self.per_engine_labelvalues[engine_idx]]
        self.counter.labels(*values).inc(sum(sum(v) for v in transfer_stats_data.values()))


class PromConnector(StatsConnector):
    """A StatsConnector whose class builds its own Prometheus metrics."""

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> PromChildMetrics:
        return PromChildMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
