"""A StoreConnector whose worker side raises in its hooks: the child MuxConnector must survive."""

from __future__ import annotations

from typing import Any

from kvmux.vllm.store_connector import StoreConnector


class ChildFailure(RuntimeError):
    """Raised on purpose by FailingWorkerConnector."""


class FailingWorkerConnector(StoreConnector):
    """Offers and plans like a memory tier, then fails every load and save on the worker."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise ChildFailure("start_load_kv failed on purpose")

    def wait_for_save(self) -> None:
        raise ChildFailure("wait_for_save failed on purpose")
