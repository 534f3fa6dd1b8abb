"""StoreConnector's worker half: a step's plan in, the tier worker's copies and reports out."""

from __future__ import annotations

from typing import Any

from kvmux.tier.scheduler.plan import TierStepPlan
from kvmux.tier.worker.base import WorkerBase
from kvmux.vllm.metadata import StoreWorkerMetadata

__all__ = ["StoreConnectorWorker"]


class StoreConnectorWorker:
    """The worker side of one tier: loads, saves, and what failed, reported once."""

    def __init__(self, worker: WorkerBase, num_groups: int):
        self.worker = worker
        self.num_groups = num_groups
        self._async_errors: set[int] = set()  # blocks of finished async loads that failed
        self._failed_loads: dict[str, int] = {}  # request -> first failed position, to report

    def register(self, kv_caches: dict[str, Any], num_blocks: int, groups: Any) -> None:
        """Adopt the engine's KV cache tensors (with several groups, each one's layers)."""
        layers = [list(g.layer_names) for g in groups] if len(groups) > 1 else None
        self.worker.register(kv_caches, num_blocks, layers)

    def has_layer_work(self, plan: TierStepPlan | None) -> bool:
        """Whether the step has per-layer work: only a memory tier copying loads by layer."""
        return plan is not None and bool(plan.loads) and self.worker.copies_by_layer

    def start(self, plan: TierStepPlan | None) -> None:
        """Load the synchronous loads' blocks now; start the asynchronous loads."""
        if plan is not None:
            self.worker.load(plan.loads)
            self.worker.start_loads(plan.async_loads, plan.idle)

    def save(self, plan: TierStepPlan | None) -> None:
        """Settle the step's layer copies; copy its full blocks out (stored off the path)."""
        self.worker.finish_layers()
        if plan is not None:
            self.worker.save(plan)

    def transfer_results(
        self, finished_req_ids: set[str], plan: TierStepPlan | None
    ) -> tuple[set[str], set[str]]:
        """(finished, failed) receives: requests whose asynchronous load ended, each once;
        failed ones only with several groups (one group: as failed blocks, see
        ``load_errors``, so that vLLM keeps the prefix below them)."""
        done = self.worker.finished_loads(finished_req_ids, plan is not None and plan.idle)
        self._failed_loads.update(done.failed)
        if self.num_groups > 1:
            return done.finished, set(done.failed)
        self._async_errors |= done.failed_blocks
        return done.finished, set()

    def load_errors(self) -> set[int]:
        """Blocks promised but missing or corrupt: the engine recomputes them."""
        errors, self._async_errors = self._async_errors, set()
        return errors | self.worker.take_load_errors()

    def worker_meta(self) -> StoreWorkerMetadata | None:
        """Keys that could not be loaded, and where loads failed, for the scheduler."""
        missing = self.worker.take_missing()
        failed, self._failed_loads = self._failed_loads, {}
        return StoreWorkerMetadata(missing, failed) if missing or failed else None
