"""StoreConnector: a vLLM V1 KV connector over one kvmux store tier."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvmux.config import (
    DiskSpec,
    MemorySpec,
    RedisSpec,
    StoreConnectorConfig,
    StoreSpec,
    parse_store_connector_config,
)
from kvmux.keys import namespace_id
from kvmux.metrics import GAUGES, TierStats
from kvmux.mux.capabilities import Capabilities
from kvmux.stores import KVStore, open_store
from kvmux.tier.scheduler.index import MirrorIndex, RemoteStoreView, SharedStoreView, TierView
from kvmux.tier.scheduler.plan import TierStepPlan
from kvmux.tier.scheduler.scheduler import TierScheduler
from kvmux.tier.worker.base import WorkerBase
from kvmux.tier.worker.slab_worker import SlabWorker
from kvmux.tier.worker.store_worker import StoreWorker
from kvmux.vllm.engine_config import (
    block_size_of,
    engine_namespace,
    engine_shards,
    group_windows,
    prefer_recompute,
    save_queue_sizing,
    saves_copy_async,
    slab_slot_bytes,
)
from kvmux.vllm.entry_layout import entry_layout
from kvmux.vllm.events import events_enabled
from kvmux.vllm.logs import adopt_vllm_logging
from kvmux.vllm.metadata import StoreConnectorMetadata
from kvmux.vllm.prom import TierPromMetrics
from kvmux.vllm.ranks import rank_agreement
from kvmux.vllm.stats import StoreConnectorStats
from kvmux.vllm.store_connector_scheduler import StoreConnectorScheduler, tier_events
from kvmux.vllm.store_connector_worker import StoreConnectorWorker

# vLLM's prompt_tokens_by_source splits hits by these; a remote store is "external".
_HIT_SOURCES = {MemorySpec: CacheHitSource.HOST, DiskSpec: CacheHitSource.DISK}

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["StoreConnector"]

log = logging.getLogger(__name__)


def _parallel_ranks() -> tuple[int, int]:
    """This worker's (tensor-parallel rank, pipeline stage)."""
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    return int(get_tp_group().rank_in_group), int(get_pp_group().rank_in_group)


def loads_async(spec: StoreSpec, num_groups: int) -> bool:
    """Whether a tier's loads run off the forward path (the spec's ``async_loads``).

    With several KV cache groups every load is asynchronous: vLLM takes the load failures
    of such a model only per request (``failed_recving``), which only a request waiting
    for an asynchronous load can get; a failed block id would stop the engine.
    """
    if num_groups > 1:
        if spec.async_loads == "never":
            log.warning(
                "kvmux tier %s: async_loads 'never' overridden: a model with several KV "
                "cache groups loads asynchronously",
                spec.name,
            )
        return True
    if spec.async_loads == "auto":
        return not isinstance(spec, MemorySpec)  # host memory is quicker than the wait
    return spec.async_loads == "always"


class StoreConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads prompt prefixes from, and saves every full prompt block to, one tier.

    With ``offload_prompt_only`` false (the tier's, or a request's ``kv_transfer_params``)
    a request's generated blocks are saved too, so the next turn of a chat loads the reply.

    Hybrid models (several KV cache groups) store each group's share of a block as its
    own entry; a sliding-window group only the blocks inside its window.

    Loads from a slow tier (disk, Redis; any tier of a hybrid model) are asynchronous:
    the request waits while loader threads read and copy its blocks, the other requests
    keep running, and ``get_transfer_results`` reports it. A failed asynchronous load is
    reported as the request's failed blocks with one KV cache group (vLLM keeps the prefix
    below them) and as a failed request with several (vLLM recomputes it).
    """

    def mux_capabilities(self) -> Capabilities:
        """What a MuxConnector may skip or coordinate for this tier (``SupportsMux``):
        it loads from any offset; save_kv_layer does nothing; wait_for_layer_load works
        only for a memory tier copying loads layer by layer, and has_connector_metadata
        says per step whether it does; update_connector_output acts on the tier's own
        metadata only; events come only where the engine publishes them; loads agree
        across tensor-parallel ranks where the worker does (both known once the worker
        adopted the KV cache)."""
        work = getattr(self, "work", None)
        sched = getattr(self, "sched", None)
        return Capabilities(
            offset_loads=True,
            layer_loads=work is not None and work.worker.copies_by_layer,
            layer_saves=False,
            layer_work_by_step=True,
            output_needs_meta=True,
            publishes_events=sched is not None and sched.events is not None,
            agrees_across_ranks=work is not None and work.worker.agrees_with_ranks,
            names_load_blocks=True,
            drops_saves=True,
        )

    @property
    def requires_kv_delivery(self) -> bool:
        """A dropped save is only a future miss."""
        return False

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        adopt_vllm_logging()  # vLLM may have set up its handlers after kvmux was imported
        self.config: StoreConnectorConfig = parse_store_connector_config(
            self._kv_transfer_config.kv_connector_extra_config
        )
        spec = self.config.store
        self._windows = group_windows(kv_cache_config)  # refuses groups kvmux cannot store
        self.tier_name = spec.name
        self._cache_hit_source = _HIT_SOURCES.get(type(spec), CacheHitSource.EXTERNAL_UNSPECIFIED)
        self.stats = TierStats()  # this instance's own counters (one half of the tier)
        namespace = engine_namespace(vllm_config, kv_cache_config)
        if spec.signing is not None:  # signed and unsigned entries never share a key
            namespace["entries"] = "signed"
        if spec.epoch:  # the operator's: nothing stored under another epoch is served
            namespace["epoch"] = spec.epoch
        self._namespace = namespace_id(namespace)
        self._block_size = block_size_of(kv_cache_config)
        self._last_stats: dict[str, float] = {}
        self._async_loads = loads_async(spec, len(self._windows))
        # the half of this role (vLLM's offloading connector's shape): the other is None
        self._rank = 0  # the worker's rank among all (pipeline stage, then TP rank)
        self.sched: StoreConnectorScheduler | None = None
        self.work: StoreConnectorWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.sched = self._build_scheduler(vllm_config, kv_cache_config)
            prefer_recompute(self._kv_transfer_config, self.config.fail_on_load_error)
        else:
            self.work = StoreConnectorWorker(
                self._build_worker(vllm_config, kv_cache_config), len(self._windows)
            )
        layout = entry_layout(vllm_config, kv_cache_config)
        log.info(
            "kvmux StoreConnector %s (%s) ready as %s; entries %s%s",
            spec.name,
            type(spec).__name__,
            role.name,
            layout.name,
            f" ({layout.reason})" if layout.reason else "",
        )

    def _build_scheduler(
        self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
    ) -> StoreConnectorScheduler:
        spec = self.config.store
        view = self._scheduler_view(vllm_config, kv_cache_config)
        events = None
        if events_enabled(vllm_config):
            events = tier_events(spec, self._block_size, kv_cache_config, view)
        fence_saves = saves_copy_async()
        scheduler = TierScheduler(
            view,
            self._block_size,
            self._namespace,
            self.stats,
            self._windows,
            self._async_loads,
            record_saves=events is not None,
            fence_saves=fence_saves,
        )
        return StoreConnectorScheduler(
            spec, scheduler, view, events, self.stats, self._block_size, fence_saves
        )

    def _build_worker(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> WorkerBase:
        spec = self.config.store
        tp_rank, stage = _parallel_ranks()
        self._rank = stage * int(vllm_config.parallel_config.tensor_parallel_size) + tp_rank
        self.stats.count_blocks(self._rank == 0)  # every rank moves the same blocks
        worker: WorkerBase
        if isinstance(spec, MemorySpec):  # host slots, no bytes: see tier/worker/slab.py
            worker = self.open_slab_worker(spec, spec.capacity // slab_slot_bytes(kv_cache_config))
        else:
            worker = StoreWorker(
                self.open_store(spec),
                self._namespace,
                self._rank,
                self.stats,
                save_queue_sizing(vllm_config, spec.save_queue, self._block_size),
                spec.signing,
                engine_shards(vllm_config, kv_cache_config, tp_rank, stage),
            )
        agreement = rank_agreement(vllm_config)
        if agreement is not None:
            worker.agree_with_ranks(agreement)
        return worker

    def _scheduler_view(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> TierView:
        spec = self.config.store
        shards = engine_shards(vllm_config, kv_cache_config).per_block  # a hit needs them all
        if isinstance(spec, MemorySpec):  # only the workers can see it: mirror it
            return MirrorIndex(spec.capacity, slab_slot_bytes(kv_cache_config))
        if isinstance(spec, RedisSpec):
            return RemoteStoreView(
                self.open_store(spec), self.stats, spec.lookup_wait, spec.signing, shards
            )
        return SharedStoreView(self.open_store(spec), self.stats, spec.signing, shards)

    def open_slab_worker(self, spec: MemorySpec, slots: int) -> SlabWorker:
        """The memory tier's worker half (a subclass may wrap it, e.g. in tests)."""
        return SlabWorker(spec.name, slots, self._rank, self.stats)

    def open_store(self, spec: StoreSpec) -> KVStore:
        """The store this connector's half uses (a subclass may wrap it, e.g. in tests)."""
        return open_store(spec)

    # -- scheduler side: StoreConnectorScheduler ------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Tokens past ``num_computed_tokens`` that the tier holds; whether they load async."""
        assert self.sched is not None
        hit = self.sched.lookup(request, num_computed_tokens)
        return hit, bool(hit) and self._async_loads

    def may_load_async(self, request: Request) -> bool:
        """(vLLM 0.34+) Whether this tier may load ``request`` asynchronously."""
        return self._async_loads

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Plan the load of the promised blocks into the blocks just allocated.

        After an asynchronous load vLLM calls this again, with no external tokens.
        """
        assert self.sched is not None
        self.sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's loads, saves and evictions."""
        assert self.sched is not None
        return StoreConnectorMetadata(self.sched.build_plan(scheduler_output))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Forget keys the workers could not load; never offer a failed load again."""
        assert self.sched is not None
        self.sched.update_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Saves are copied out within the step, so the blocks may be freed at once.

        A request aborted while its asynchronous load runs: vLLM itself holds its blocks
        until the workers report the load finished, which they do once, load stopped.
        """
        assert self.sched is not None
        self.sched.finished(request)
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The hybrid manager's finish (every group at once): the blocks may be freed at once."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def take_events(self) -> Iterable[KVCacheEvent]:
        """The tier's KV cache events since the last call (none unless the engine publishes)."""
        return self.sched.take_events() if self.sched is not None else ()

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """A load restores every group's blocks of the hit (each group's window, if any)."""
        return tuple(range(len(self._windows)))

    # -- worker side: StoreConnectorWorker ------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Adopt the engine's KV cache tensors."""
        assert self.work is not None
        config = self._kv_cache_config
        self.work.register(kv_caches, config.num_blocks, config.kv_cache_groups)

    def _plan(self) -> TierStepPlan | None:
        if not KVConnectorBase_V1.has_connector_metadata(self):
            return None
        meta = self._get_connector_metadata()
        return meta.plan if isinstance(meta, StoreConnectorMetadata) else None

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Take the step's plan; first wait for in-flight copies of saved blocks the step
        is about to overwrite (a GPU's; ``tier/fences.py``). Also past an open breaker
        of a parent: a parent binds every child, cut off or not."""
        super().bind_connector_metadata(connector_metadata)
        if self.work is not None and isinstance(connector_metadata, StoreConnectorMetadata):
            self.work.worker.fence(connector_metadata.plan)

    def has_connector_metadata(self) -> bool:
        """Whether this step has per-layer work: vLLM asks before every attention layer
        and calls ``wait_for_layer_load`` and ``save_kv_layer`` only if so. Only a memory
        tier copying a step's loads layer by layer has any."""
        return self.work is not None and self.work.has_layer_work(self._plan())

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Load the synchronous loads' blocks now; start the asynchronous loads."""
        if self.work is not None:
            self.work.start(self._plan())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Wait for the layer's share of this step's load (the memory tier may copy loads
        layer by layer beside the forward pass; other tiers copy them in ``start_load_kv``)."""
        if self.work is not None:
            self.work.worker.wait_layer(layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Blocks are copied out once per step in ``wait_for_save``."""

    def wait_for_save(self) -> None:
        """Settle this step's layer copies; copy its full blocks out (stored off the path)."""
        if self.work is not None:
            self.work.save(self._plan())

    def mux_join_agreement(self, meta: KVConnectorMetadata) -> None:
        """This rank leaves the step's loads out (a MuxConnector's breaker or a failed
        bind, rank-local): join the other ranks' collective, every load failed."""
        if self.work is not None and isinstance(meta, StoreConnectorMetadata):
            self.work.worker.join_agreement(meta.plan.loads)

    @staticmethod
    def mux_load_blocks(meta: KVConnectorMetadata) -> list[int]:
        """Ids of the blocks ``meta`` loads, for a MuxConnector to name if this tier fails."""
        assert isinstance(meta, StoreConnectorMetadata)
        plan = meta.plan
        ids = [t.block_id for t in plan.loads]
        ids += [t.block_id for load in plan.async_loads for t in load.transfers]
        return ids

    def mux_drop_saves_over(self, block_ids: set[int]) -> None:
        """Blocks a sibling failed to load this step: save nothing computed over them."""
        if self.work is not None:
            self.work.worker.drop_saves_over(block_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Requests whose asynchronous load ended, each once; failed ones with several groups.

        ``finished_req_ids``: requests the engine finished (aborted ones among them) whose
        loads may stop. A failed load of a one-group model is reported as its failed
        blocks (``get_block_ids_with_load_errors``, in this same step), so vLLM keeps the
        prefix below them; with several groups vLLM takes failures per request only.
        """
        if self.work is None:
            return KVConnectorTransferResults()
        finished, failed = self.work.transfer_results(finished_req_ids, self._plan())
        return KVConnectorTransferResults(finished_recving=finished, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks promised but missing or corrupt: the engine recomputes them."""
        return set() if self.work is None else self.work.load_errors()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        """Report keys that could not be loaded, and where loads failed, to the scheduler."""
        return None if self.work is None else self.work.worker_meta()

    def get_kv_connector_stats(self) -> StoreConnectorStats | None:
        """This half's counters since the last call (vLLM adds up both halves)."""
        now = self.stats.snapshot()
        delta = {k: v - self._last_stats.get(k, 0) for k, v in now.items() if k not in GAUGES}
        self._last_stats = now
        stats = StoreConnectorStats(data=delta)
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> StoreConnectorStats:
        """Rebuild the stats sent from the workers."""
        return StoreConnectorStats(data=dict(data or {}))

    # vLLM asks the class these before the connector exists: each one parses the extra
    # config, so a bad one stops vLLM there, with the same one-line ConfigError.

    @classmethod
    def parse_extra_config(cls, extra_config: Any) -> StoreConnectorConfig:
        """The connector's ``kv_connector_extra_config``, parsed (ConfigError if bad)."""
        return parse_store_connector_config(extra_config)

    @classmethod
    def _class_config(cls, ktc: KVTransferConfig | None) -> StoreConnectorConfig:
        """The parsed extra config, for vLLM's class-level queries."""
        return cls.parse_extra_config(ktc.kv_connector_extra_config if ktc else None)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Never (no layer-wise work); validates the extra config (GPU, at config build)."""
        cls.parse_extra_config(extra_config)
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """No layout needed; validates the extra config (engine core, before profiling)."""
        cls._class_config(vllm_config.kv_transfer_config)
        return None

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: Any,
    ) -> TierPromMetrics:
        """This tier's own counters, ``kvmux_tier_<counter>_total{tier=...}``, zeros included."""
        tier = cls._class_config(vllm_config.kv_transfer_config).store.name
        return TierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, tier)

    def shutdown(self) -> None:
        """Write out queued saves and close the store (or the scheduler's view of it)."""
        if self.work is not None:
            self.work.worker.close()
        if self.sched is not None:
            self.sched.close()

    def reset_cache(self) -> bool | None:
        """Move the tier to a new generation: nothing stored before is served after.

        vLLM calls this on the scheduler side (``reset_prefix_cache(reset_connector=True)``,
        e.g. after a weight update). A shared tier's generation lives in the tier, so
        every engine using it moves too. False when the tier could not be reached.
        """
        if self.sched is not None:
            return self.sched.reset()
        if self.work is not None:
            self.work.worker.clear()
        return True
