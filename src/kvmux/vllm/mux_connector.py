"""MuxConnector: compose any vLLM KV connectors, load piecewise, isolate failures.

A role dispatcher: it builds its children and their ``Roster`` (``mux/roster.py``), then
the one half its role needs: ``MuxScheduler`` (``mux/scheduler.py``) in the scheduler,
``MuxWorker`` (``mux/worker.py``) in a worker. Each hook hands over to that half, or fans
out to every child through the roster; only the per-layer hooks loop here themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
    supports_hma,
)

from kvmux.errors import ConfigError
from kvmux.mux.roster import Roster
from kvmux.mux.scheduler import MuxScheduler
from kvmux.mux.worker import MuxWorker
from kvmux.policies.breaker import CircuitBreaker
from kvmux.policies.registry import make_policy
from kvmux.vllm import children as child_classes_of
from kvmux.vllm.children import child_classes, mux_config
from kvmux.vllm.engine_config import prefer_recompute
from kvmux.vllm.logs import adopt_vllm_logging
from kvmux.vllm.metadata import MuxMetadata, MuxWorkerMetadata
from kvmux.vllm.mux_stats import MuxStatsReporter
from kvmux.vllm.prom import CHILD_LABEL, MuxPromMetrics, SharedMetricTypes
from kvmux.vllm.stats import MuxConnectorStats, connector_path

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVConnectorKVEvents
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["BASE_NO_OPS", "MuxConnector"]

log = logging.getLogger("kvmux.mux")
# hooks whose KVConnectorBase_V1 implementation does nothing and returns a constant, and
# whose answers MuxConnector does not keep per child: a child that does not override one
# is not called for it
BASE_NO_OPS = (
    "on_new_request",
    "update_connector_output",
    "take_events",
    "has_pending_block_frees",
    "has_pending_push_work",
    "get_kv_connector_kv_cache_events",
    "finish_forward",
    "reset_capture_state",
)


class MuxConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads a request from one or several children, saves to all, survives their failures.

    It declares HMA support at class level (vLLM asks the class, not its children); a model
    with several KV cache groups is refused at start if any child cannot handle them.
    """

    sched: MuxScheduler  # the scheduler half
    work: MuxWorker  # the worker half

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        adopt_vllm_logging()  # vLLM may have set up its handlers after kvmux was imported
        self.config = config = mux_config(vllm_config)
        classes = child_classes(vllm_config)
        groups = _group_count(kv_cache_config)
        child_classes_of.refuse_hybrid_without_hma(classes, groups)
        self._roster = Roster(
            (
                (label, cls(temp, role, kv_cache_config), connector_path(cls), supports_hma(cls))
                for label, cls, temp in classes
            ),
            lambda: CircuitBreaker(config.breaker_seconds, config.breaker_max_seconds),
            KVConnectorBase_V1,
            BASE_NO_OPS,
        )
        self._several_groups = groups > 1  # load failures go per request
        self._block_size = int(vllm_config.cache_config.block_size)
        # only the half of this role is built (a plain attribute: hooks read it per call);
        # the other is built if one of its hooks is called all the same (``__getattr__``:
        # vLLM never does, its MultiConnector tests do)
        if role == KVConnectorRole.SCHEDULER:
            self.sched = self._build_scheduler()
        else:
            self.work = self._build_worker()
        self._stats = MuxStatsReporter(self._roster)
        prefer_recompute(self._kv_transfer_config, config.fail_on_load_error)
        labels = ", ".join(m.label for m in self._roster.members)
        log.info("kvmux MuxConnector (%s, policy %s): %s", role.name, config.policy, labels)

    @property
    def children(self) -> list[KVConnectorBase_V1]:
        """The child connectors, in load order."""
        return list(self._roster.connectors)

    def _build_scheduler(self) -> MuxScheduler:
        policy = make_policy(self.config.policy)
        return MuxScheduler(self._roster, policy, self._block_size, self._several_groups)

    def _build_worker(self) -> MuxWorker:
        return MuxWorker(
            self._roster,
            give_up_seconds=self.config.breaker_max_seconds,
            per_request_failures=self._several_groups,
        )

    def __getattr__(self, name: str) -> Any:
        """The half of the other role, built when first asked for (see ``__init__``)."""
        if name in ("sched", "work"):
            try:
                half = self._build_scheduler() if name == "sched" else self._build_worker()
            except AttributeError as exc:  # not "no such attribute": the half failed to build
                raise RuntimeError(f"MuxConnector cannot build its {name} half: {exc}") from exc
            setattr(self, name, half)
            return half
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- properties and class-level queries: over the children's classes -------------

    @property
    def requires_kv_delivery(self) -> bool:
        """True if any child hands off KV that must be delivered (a child that raises: True)."""
        return any(self._roster.fan_out_call("requires_kv_delivery", _delivers, True))

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """Only when there are children and every one does (a child that raises does not)."""
        found = self._roster.fan_out_call("supports_divergent_local_hybrid_hits", _divergent, False)
        return bool(found) and all(found)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """The children's common layout requirement; a mismatch is a ConfigError."""
        return child_classes_of.common_kvcache_layout(vllm_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """True if any child needs piecewise CUDA graphs."""
        return child_classes_of.any_piecewise_for_cudagraph(extra_config)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """(vLLM 0.33+) Only when every child does."""
        return child_classes_of.all_support_sleep_mode(kv_transfer_config)

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """(vLLM 0.34+) Only when there are children and every one does."""
        return child_classes_of.all_support_lookahead(kv_transfer_config)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> Any:
        """(vLLM 0.34+) Every access any child needs to the KV cache memory."""
        return child_classes_of.every_cache_access(kv_transfer_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> MuxConnectorStats:
        """Rebuild the stats sent from the engine: each child's by its own class."""
        return MuxConnectorStats.from_payload(data or {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: Any,
    ) -> MuxPromMetrics:
        """The mux's counters per child, and each child's own metrics with a child label."""
        shared = SharedMetricTypes(metric_types)
        names = [*labelnames, CHILD_LABEL]
        children = child_classes_of.children_prom_metrics(
            vllm_config, shared.types, names, per_engine_labelvalues
        )
        return MuxPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues, children
        )

    # -- scheduler side -----------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """Bind the cache manager to every child (each binds the block pool itself, once)."""
        self._kv_cache_manager = kv_cache_manager
        self._roster.fan_out("bind_kv_cache_manager", kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """Bind the engine's block pool to every child."""
        self._roster.fan_out("bind_gpu_block_pool", gpu_block_pool)

    def on_new_request(self, request: Request) -> None:
        """Tell every child about a new request (every child that listens: see BASE_NO_OPS)."""
        self.sched.on_new_request(request)

    def may_load_async(self, request: Request) -> bool:
        """(vLLM 0.34+) True if any child may load the request asynchronously."""
        ask = lambda c: bool(c.may_load_async(request))  # noqa: E731
        return any(self._roster.fan_out_call("may_load_async", ask, False))

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """What the children offer together, per the policy; None while a child looks."""
        return self.sched.lookup(request, num_computed_tokens)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """The groups every contributor restores (a group only some restore is not whole)."""
        groups = self.sched.loaded_groups(request)
        return super().get_loaded_kv_cache_group_ids(request) if groups is None else groups

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[Any, int]:
        """Hit sources summed over the contributors."""
        return self.sched.hit_sources(request)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Each contributor gets its share; every other child gets 0."""
        self.sched.after_alloc(request, blocks, num_external_tokens)

    def can_load_prefix_replay_checkpoint(
        self, request: Request, num_local_tokens: int, num_external_tokens: int
    ) -> bool:
        """(vLLM main) The answer of the child whose planned load covers the hit's end."""
        return self.sched.can_load_checkpoint(request, num_local_tokens, num_external_tokens)

    def consume_prefix_replay_checkpoint(self, request: Request, num_hit_tokens: int) -> bool:
        """(vLLM main) The answer of the child whose planned load covers ``num_hit_tokens``."""
        return self.sched.consume_checkpoint(request, num_hit_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """Children's metadata in order plus the mux's own plan."""
        return MuxMetadata(*self.sched.build_meta(scheduler_output))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Hand each child its own worker metadata; open breakers the workers opened."""
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, MuxWorkerMetadata):
            self.sched.update_output(connector_output, meta.children, tuple(meta.open_children))
        else:
            self.sched.update_output(connector_output, None, ())

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Hold the blocks until every async-saving child finished; merge transfer params."""
        return self.sched.request_finished(request, block_ids, all_groups=False)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """HMA variant: children that support HMA get all groups, others group 0."""
        return self.sched.request_finished(request, block_ids, all_groups=True)

    def register_finished_partial_tail(
        self, request: Request, block_ids: Any, partial_tail_offloads: Any
    ) -> bool:
        """True if any child takes the partial tail (each that does owes a finished send)."""
        return self.sched.keep_partial_tail(request, block_ids, partial_tail_offloads)

    def take_events(self) -> Iterable[Any]:
        """Events of every child."""
        return self.sched.take_events()

    def has_pending_block_frees(self) -> bool:
        """True if any child will free blocks soon."""
        return any(self._roster.fan_out("has_pending_block_frees", default=False))

    def has_pending_push_work(self) -> bool:
        """True if any child has push work."""
        return any(self._roster.fan_out("has_pending_push_work", default=False))

    def set_xfer_handshake_metadata(
        self, metadata: dict[int, KVConnectorHandshakeMetadata]
    ) -> None:
        """Every child gets the handshake metadata."""
        self._roster.fan_out("set_xfer_handshake_metadata", metadata)

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        """Every child gets the PP-aware handshake metadata."""
        self._roster.fan_out("set_xfer_handshake_metadata_pp_aware", metadata)

    def reset_cache(self) -> bool:
        """Reset every child; True only if all succeeded."""
        return all(r is not False for r in self._roster.fan_out("reset_cache", default=False))

    # -- worker side ----------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Give every child the KV caches (a child may then take on per-layer work)."""
        self.work.register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        """(vLLM 0.33+) Every child lets go of the KV caches (sleep, weight updates)."""
        self._roster.fan_out("unregister_kv_caches")

    def restore_kv_caches(self) -> None:
        """(vLLM 0.33+) Every child takes the KV caches back after a wake-up."""
        self._roster.fan_out("restore_kv_caches")

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        """Every child gets the copy ops."""
        self._roster.fan_out("set_host_xfer_buffer_ops", copy_operation)

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        """The first child's handshake metadata that is not None."""
        found: KVConnectorHandshakeMetadata | None = self._roster.first_not_none(
            "get_handshake_metadata"
        )
        return found

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Bind each child's metadata, in order."""
        KVConnectorBase_V1.bind_connector_metadata(self, connector_metadata)  # no super(): hot
        assert isinstance(connector_metadata, MuxMetadata)
        self.work.begin_step(connector_metadata.plan, connector_metadata.children)

    def clear_connector_metadata(self) -> None:
        """Unbind every child."""
        KVConnectorBase_V1.clear_connector_metadata(self)
        self.work.end_step()

    def has_connector_metadata(self) -> bool:
        """Whether a child has per-layer work in this step.

        vLLM asks this before each attention layer and calls ``wait_for_layer_load`` and
        ``save_kv_layer`` only if it holds, so a step in which no child works per layer
        (kvmux tiers without a layer-by-layer load, mostly) costs no call per layer.
        """
        worker: MuxWorker | None = self.__dict__.get("work")
        if worker is None:
            return KVConnectorBase_V1.has_connector_metadata(self)
        return bool(worker.layer_loads or worker.layer_saves)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Each child handles preemptions with its own metadata."""
        assert isinstance(kv_connector_metadata, MuxMetadata)
        self.work.handle_preemptions(kv_connector_metadata.children)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Start every loading child's loads."""
        self.work.start_loads(forward_context, kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Wait for every loading child that works per layer (once per layer: a plain
        loop over ``MuxWorker.layer_loads``, each call guarded)."""
        worker = self.work
        for i, child in worker.layer_loads:
            try:
                child.wait_for_layer_load(layer_name)
            except Exception as exc:
                worker.layer_failed(i, "wait_for_layer_load", exc)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Every saving child that works per layer saves the layer (once per layer: a plain
        loop over ``MuxWorker.layer_saves``, each call guarded)."""
        worker = self.work
        for i, child in worker.layer_saves:
            try:
                child.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
            except Exception as exc:
                worker.layer_failed(i, "save_kv_layer", exc)

    def wait_for_save(self) -> None:
        """Every saving child finishes its step's saves, once all load errors are known."""
        self.work.save()

    def finish_forward(self) -> None:
        """Tell every child the forward pass is done."""
        self._roster.fan_out("finish_forward")

    def reset_capture_state(self) -> None:
        """Reset every child's capture state."""
        self._roster.fan_out("reset_capture_state")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Each request once, after all of its loaders (or savers) finished."""
        results = KVConnectorTransferResults()
        checkpoints: dict[str, Any] = {}
        self.work.transfer_results(
            finished_req_ids,
            (results.finished_sending, results.finished_recving, results.failed_recving),
            checkpoints,
        )
        if checkpoints:  # a field of vLLM main's results: see MuxWorker._release_checkpoints
            results.prefix_replay_checkpoints = checkpoints  # type: ignore[attr-defined]
        return results

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Finished sends and receives, each request exactly once."""
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks that any child, or the mux on a child's behalf, failed to load."""
        return self.work.load_errors()

    def get_finished_count(self) -> int | None:
        """The children's common finished count, if they all state one."""
        counts = self._roster.fan_out("get_finished_count")
        if any(c is None for c in counts):
            return None
        if len(set(counts)) > 1:
            raise ConfigError("connectors", f"children expect different finished counts: {counts}")
        return counts[0] if counts else None

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        """Each child's worker metadata, and which children this worker has cut off."""
        found = self.work.worker_meta()
        return None if found is None else MuxWorkerMetadata(*found)

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        """The children's KV cache events of the step; several children's are merged."""
        if not self._roster.listening("get_kv_connector_kv_cache_events"):
            return None
        found = [
            e for e in self._roster.fan_out("get_kv_connector_kv_cache_events") if e is not None
        ]
        if not found:
            return None
        merged: KVConnectorKVEvents = found[0]
        for events in found[1:]:
            try:
                merged = merged.merge(events)
            except Exception as exc:  # events of unlike kinds: keep the first child's
                log.warning("kvmux mux: cannot merge KV cache events: %r", exc)
        return merged

    # -- either side -------------------------------------------------------------------

    def get_kv_connector_stats(self) -> MuxConnectorStats | None:
        """Each child's stats of this interval, and the mux's counters per child."""
        return self._stats.take()

    def child_counters(self) -> dict[str, dict[str, float]]:
        """Each child's counters since start, by label, as this side of the mux saw them."""
        return self._stats.totals()

    def shutdown(self) -> None:
        """Shut every child down, even if one fails."""
        self._roster.fan_out("shutdown")

    def get_mem_pool_context(self) -> Any:
        """The first child's memory pool context, if any (unguarded, as MultiConnector: a
        child whose pool cannot be made stops the worker's start, never a silent other
        pool for its KV cache)."""
        for child in self._roster.connectors:
            context = child.get_mem_pool_context()
            if context is not None:
                return context
        return None


def _delivers(child: KVConnectorBase_V1) -> bool:
    """The child's ``requires_kv_delivery``."""
    return bool(child.requires_kv_delivery)


def _divergent(child: KVConnectorBase_V1) -> bool:
    """The child's ``supports_divergent_local_hybrid_hits``."""
    return bool(child.supports_divergent_local_hybrid_hits)


def _group_count(kv_cache_config: KVCacheConfig | None) -> int:
    """How many KV cache groups the model has (0 when vLLM gives no KV cache config)."""
    return len(getattr(kv_cache_config, "kv_cache_groups", None) or ())
