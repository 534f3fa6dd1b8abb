"""MuxConnector: compose any vLLM KV connectors, load piecewise, isolate failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
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
from kvmux.mux.capabilities import capabilities_of
from kvmux.mux.guard import ChildGuard, Notices
from kvmux.mux.sole import scheduler_class
from kvmux.mux.worker import MuxWorker
from kvmux.policies.breaker import CircuitBreaker
from kvmux.vllm.children import child_classes, child_transfer_configs, mux_config
from kvmux.vllm.engine_config import prefer_recompute
from kvmux.vllm.logs import adopt_vllm_logging
from kvmux.vllm.metadata import MuxMetadata, MuxWorkerMetadata
from kvmux.vllm.prom import CHILD_LABEL, MuxPromMetrics, SharedMetricTypes
from kvmux.vllm.stats import MUX_COUNTERS, MuxConnectorStats, MuxCounterStats, connector_path

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

__all__ = ["MuxConnector"]

log = logging.getLogger("kvmux.mux")
Child = tuple[int, KVConnectorBase_V1, ChildGuard]  # position, connector, guard
_NOT_FINISHED: tuple[bool, None] = (False, None)  # request_finished of a child that raised
STATS_LOG_SECONDS = 60.0
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
# the mux's own counters go out at most this often (at once after an error, a breaker
# change or a finished request, so an engine going idle has reported them all); they are
# exact, only reported later. Children's own stats go out every step.
COUNTERS_SECONDS = 1.0


class MuxConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads a request from one or several children, saves to all, survives their failures.

    It declares HMA support at class level (vLLM asks the class, not its children); a model
    with several KV cache groups is refused at start if any child cannot handle them.
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        adopt_vllm_logging()  # vLLM may have set up its handlers after kvmux was imported
        self.config = mux_config(vllm_config)
        self._children: list[KVConnectorBase_V1] = []
        self._guards: list[ChildGuard] = []
        self._child_paths: dict[str, str] = {}  # label: connector class, for stats
        self._notices = Notices()  # something to report at once, from any child's guard
        children = child_classes(vllm_config)
        _refuse_hybrid_without_hma(children, kv_cache_config)
        for label, cls, temp in children:
            self._children.append(cls(temp, role, kv_cache_config))
            self._child_paths[label] = connector_path(cls)
            breaker = CircuitBreaker(self.config.breaker_seconds, self.config.breaker_max_seconds)
            self._guards.append(ChildGuard(label, breaker, self._notices))
        capabilities = [capabilities_of(c) for c in self._children]  # mux/capabilities.py
        offset_capable = [caps.offset_loads for caps in capabilities]
        block_size = int(vllm_config.cache_config.block_size)
        several_groups = _group_count(kv_cache_config) > 1  # failures go per request
        self._scheduler = scheduler_class(len(self._children))(
            self._children,
            self._guards,
            self.config.policy,
            offset_capable,
            block_size,
            async_only=several_groups,
        )
        self._worker = MuxWorker(
            self._children,
            self._guards,
            give_up_seconds=self.config.breaker_max_seconds,
            per_request_failures=several_groups,
        )
        self._pairs = list(zip(self._children, self._guards, strict=True))
        self._all = [(i, c, g) for i, (c, g) in enumerate(self._pairs)]
        # per hook whose base implementation does nothing: the children that override it
        self._callers = {hook: _overriding(self._all, hook) for hook in BASE_NO_OPS}
        # kvmux tiers that publish no KV events have none to take
        self._callers["take_events"] = [
            c for c in self._callers["take_events"] if capabilities[c[0]].publishes_events
        ]
        # children whose update_connector_output acts on their own worker metadata only
        # (``output_needs_meta``, a kvmux tier's) are not called without it
        self._reads_meta = [caps.output_needs_meta for caps in capabilities]
        self._readers = [
            c for c in self._callers["update_connector_output"] if not self._reads_meta[c[0]]
        ]
        self._finishers = [(c, g, supports_hma(c)) for c, g in self._pairs]
        self._stats_sources = [(c, g, self._child_paths[g.label]) for c, g in self._pairs]
        self._last_stats_log = time.monotonic()
        self._counters_due = 0.0  # when the mux's own counters are next reported
        # requests the scheduler added and has not finished: when the last one finishes,
        # the engine may idle, so the counters go out with that step (never below 0: a
        # vLLM that does not call on_new_request reports at every finish)
        self._live = 0
        # request -> children that took its partial tail (register_finished_partial_tail)
        self._tail_keepers: dict[str, list[int]] = {}
        prefer_recompute(self._kv_transfer_config, self.config.fail_on_load_error)
        labels = ", ".join(g.label for g in self._guards)
        log.info("kvmux MuxConnector (%s, policy %s): %s", role.name, self.config.policy, labels)

    @property
    def children(self) -> list[KVConnectorBase_V1]:
        """The child connectors, in load order."""
        return list(self._children)

    def _each(self, hook: str, *args: Any, default: Any = None) -> list[Any]:
        """``child.<hook>(*args)`` of every child, each guarded (``default`` if it raised);
        run even past an open breaker. A hook in ``BASE_NO_OPS`` reaches only the children
        that override it (the others' would do nothing)."""
        results = []
        for _, child, guard in self._callers.get(hook, self._all):
            try:
                results.append(getattr(child, hook)(*args))
            except Exception as exc:
                guard.fail(hook, exc)
                results.append(default)
        return results

    def _each_call(self, hook: str, call: Any, default: Any = None) -> list[Any]:
        """``call(child)`` for every child, each guarded; run even past an open breaker."""
        return [g.invoke(hook, call, (c,), default, always=True) for c, g in self._pairs]

    # -- properties and class-level queries -------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        """True if any child hands off KV that must be delivered (a child that raises: True)."""
        return any(self._each_call("requires_kv_delivery", _delivers, True))

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """Only when there are children and every one does (a child that raises does not)."""
        found = self._each_call("supports_divergent_local_hybrid_hits", _divergent, False)
        return bool(found) and all(found)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """The children's common layout requirement; a mismatch is a ConfigError."""
        wanted: dict[str, str] = {}
        for label, child_cls, temp in child_classes(vllm_config):
            layout = child_cls.get_required_kvcache_layout(temp)
            if layout is not None:
                wanted[label] = layout
        if len(set(wanted.values())) > 1:
            found = ", ".join(f"{label} needs {layout}" for label, layout in wanted.items())
            raise ConfigError("connectors", f"KV cache layout mismatch: {found}")
        return next(iter(wanted.values()), None)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """True if any child needs piecewise CUDA graphs."""
        ktc = KVTransferConfig(
            kv_connector="MuxConnector", kv_role="kv_both", kv_connector_extra_config=extra_config
        )
        return any(
            child_cls.requires_piecewise_for_cudagraph(child_ktc.kv_connector_extra_config)
            for _, child_cls, child_ktc in child_transfer_configs(ktc)
        )

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """(vLLM 0.33+) Only when every child does."""
        children = child_transfer_configs(kv_transfer_config)
        return all(getattr(c, "supports_sleep_mode", lambda _: True)(k) for _, c, k in children)

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """(vLLM 0.34+) Only when there are children and every one does."""
        children = child_transfer_configs(kv_transfer_config)
        return bool(children) and all(
            getattr(c, "supports_lookahead_block_hashes", lambda _: False)(k)
            for _, c, k in children
        )

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> Any:
        """(vLLM 0.34+) Every access any child needs to the KV cache memory."""
        from vllm.config.kv_transfer import KVCacheAccess  # type: ignore[attr-defined]

        access = KVCacheAccess.IN_PROCESS
        ask = getattr(KVConnectorFactory, "kv_cache_access", None)
        for _, child_cls, child_ktc in child_transfer_configs(kv_transfer_config):
            access |= ask(child_ktc) if ask else child_cls.kv_cache_access(child_ktc)
        return access

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
        children: dict[str, Any] = {}
        for label, child_cls, temp in child_classes(vllm_config):
            values = {i: [*v, label] for i, v in per_engine_labelvalues.items()}
            try:
                children[label] = child_cls.build_prom_metrics(temp, shared.types, names, values)
            except Exception as exc:  # a child's metrics never keep the engine from starting
                log.warning("kvmux mux: child %s has no Prometheus metrics: %r", label, exc)
                children[label] = None
        return MuxPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues, children
        )

    # -- scheduler side -----------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """Bind the cache manager to every child (each binds the block pool itself, once)."""
        self._kv_cache_manager = kv_cache_manager
        self._each("bind_kv_cache_manager", kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """Bind the engine's block pool to every child."""
        self._each("bind_gpu_block_pool", gpu_block_pool)

    def on_new_request(self, request: Request) -> None:
        """Tell every child about a new request (every child that listens: see BASE_NO_OPS)."""
        self._live += 1
        for _, child, guard in self._callers["on_new_request"]:
            try:
                child.on_new_request(request)
            except Exception as exc:
                guard.fail("on_new_request", exc)

    def may_load_async(self, request: Request) -> bool:
        """(vLLM 0.34+) True if any child may load the request asynchronously."""
        return any(
            self._each_call("may_load_async", lambda c: bool(c.may_load_async(request)), False)
        )

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """What the children offer together, per the policy; None while a child looks."""
        return self._scheduler.lookup(request, num_computed_tokens)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """The groups every contributor restores (a group only some restore is not whole)."""
        plan = self._scheduler.contributions(request.request_id)
        if not plan:
            return super().get_loaded_kv_cache_group_ids(request)
        groups: set[int] | None = None
        for contribution in plan:
            ids = self._children[contribution.child].get_loaded_kv_cache_group_ids(request)
            groups = set(ids) if groups is None else groups & set(ids)
        return tuple(sorted(groups or ()))

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[Any, int]:
        """Hit sources summed over the contributors."""
        plan = self._scheduler.plans.get(request.request_id, ())
        if len(plan) == 1:
            loader, _, tokens, _ = plan[0]
            return self._children[loader].get_external_cache_hit_sources(request, tokens)
        sources: dict[Any, int] = {}
        for c in plan:
            for source, count in (
                self._children[c.child].get_external_cache_hit_sources(request, c.tokens).items()
            ):
                sources[source] = sources.get(source, 0) + count
        return sources

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Each contributor gets its share; every other child gets 0."""
        self._scheduler.after_alloc(request, blocks, num_external_tokens)

    def can_load_prefix_replay_checkpoint(
        self, request: Request, num_local_tokens: int, num_external_tokens: int
    ) -> bool:
        """(vLLM main) The answer of the child whose planned load covers the hit's end.

        That child loads the replay-managed state at the hit's end, so its checkpoint is
        the one that counts (MultiConnector asks its one loader). It is asked from its own
        start on; no such child, or one cut off, answers False (vLLM replays).
        """
        end = num_local_tokens + num_external_tokens
        loader = self._loader_at(request.request_id, end)
        if loader is None or self._guards[loader[0]].cut_off():
            return False
        start = max(num_local_tokens, loader[1])
        args = (request, start, end - start)
        return self._ask_loader(loader[0], "can_load_prefix_replay_checkpoint", args)

    def consume_prefix_replay_checkpoint(self, request: Request, num_hit_tokens: int) -> bool:
        """(vLLM main) The answer of the child whose planned load covers ``num_hit_tokens``.

        Routed as ``can_load_prefix_replay_checkpoint``: that child's worker reported the
        checkpoint of this boundary (``MuxWorker`` sends it with the request's receive).
        """
        loader = self._loader_at(request.request_id, num_hit_tokens)
        if loader is None:
            return False
        args = (request, num_hit_tokens)
        return self._ask_loader(loader[0], "consume_prefix_replay_checkpoint", args)

    def _loader_at(self, req_id: str, token: int) -> tuple[int, int] | None:
        """(child, start) of the request's planned load whose range ends at or covers ``token``."""
        for c in self._scheduler.contributions(req_id):
            if c.start < token <= c.end:
                return c.child, c.start
        return None

    def _ask_loader(self, i: int, hook: str, args: tuple[Any, ...]) -> bool:
        """Child ``i``'s ``hook(*args)``, guarded: False if it raised or has no such hook."""
        method = getattr(self._children[i], hook, None)
        if method is None:  # a vLLM without the hook
            return False
        return bool(self._guards[i].invoke(hook, method, args, False, always=True))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """Children's metadata in order plus the mux's own plan."""
        metas: list[KVConnectorMetadata | None] = []
        for child, guard in self._pairs:  # every child builds, even past an open breaker
            try:
                metas.append(child.build_connector_meta(scheduler_output))
            except Exception as exc:
                guard.fail("build_connector_meta", exc)
                metas.append(None)
        return MuxMetadata(tuple(metas), self._scheduler.take_step(metas))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Hand each child its own worker metadata; open breakers the workers opened."""
        meta = connector_output.kv_connector_worker_meta
        if meta is None:  # nothing from the workers: each child sees None too
            for _, child, guard in self._readers:
                try:
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    guard.fail("update_connector_output", exc)
            return
        parts: tuple[KVConnectorWorkerMetadata | None, ...] | None = None
        if isinstance(meta, MuxWorkerMetadata):
            parts = meta.children
            for i in meta.open_children:
                self._guards[i].force_open(self.config.breaker_seconds)
        reads_meta = self._reads_meta
        try:
            for i, child, guard in self._callers["update_connector_output"]:
                part = None if parts is None else parts[i]
                if part is None and reads_meta[i]:
                    continue
                connector_output.kv_connector_worker_meta = part
                try:
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    guard.fail("update_connector_output", exc)
        finally:
            connector_output.kv_connector_worker_meta = meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Hold the blocks until every async-saving child finished; merge transfer params."""
        results: list[tuple[bool, dict[str, Any] | None]] = []
        for child, guard in self._pairs:
            try:
                results.append(child.request_finished(request, block_ids))
            except Exception as exc:
                guard.fail("request_finished", exc)
                results.append(_NOT_FINISHED)
        self._last_finished()
        results = self._tail_savers(request.request_id, results)
        return self._scheduler.finished(request.request_id, results)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """HMA variant: children that support HMA get all groups, others group 0."""
        results: list[tuple[bool, dict[str, Any] | None]] = []
        for child, guard, hma in self._finishers:
            try:
                if hma:
                    results.append(child.request_finished_all_groups(request, block_ids))  # type: ignore[attr-defined]
                else:
                    results.append(child.request_finished(request, block_ids[0]))
            except Exception as exc:
                guard.fail("request_finished_all_groups", exc)
                results.append(_NOT_FINISHED)
        self._last_finished()
        results = self._tail_savers(request.request_id, results)
        return self._scheduler.finished(request.request_id, results)

    def _last_finished(self) -> None:
        """A request finished; with none left, the counters go out with this step."""
        self._live -= 1
        if self._live <= 0:
            self._live = 0
            self._notices.pending = True  # the engine may idle after this step

    def register_finished_partial_tail(
        self, request: Request, block_ids: Any, partial_tail_offloads: Any
    ) -> bool:
        """True if any child takes the partial tail; each that does owes the request's
        finished sending, as an async saver (``_tail_savers``, read by request_finished)."""
        taken = self._each(
            "register_finished_partial_tail",
            request,
            block_ids,
            partial_tail_offloads,
            default=False,
        )
        keepers = [i for i, took in enumerate(taken) if took]
        if keepers:
            self._tail_keepers[request.request_id] = keepers
        return bool(keepers)

    def _tail_savers(
        self, req_id: str, results: list[tuple[bool, dict[str, Any] | None]]
    ) -> list[tuple[bool, dict[str, Any] | None]]:
        """``results`` with each child that took the request's partial tail saving async."""
        keepers = self._tail_keepers.pop(req_id, None) if self._tail_keepers else None
        for i in keepers or ():
            results[i] = (True, results[i][1])
        return results

    def take_events(self) -> Iterable[Any]:
        """Events of every child (a list only when there are some)."""
        found: list[Any] | None = None
        for _, child, guard in self._callers["take_events"]:
            try:
                events = child.take_events()
                if events:  # a generator is true even when empty: it then adds nothing
                    found = list(events) if found is None else found + list(events)
            except Exception as exc:
                guard.fail("take_events", exc)
        return () if found is None else found

    def has_pending_block_frees(self) -> bool:
        """True if any child will free blocks soon."""
        if not self._callers["has_pending_block_frees"]:
            return False
        return any(self._each("has_pending_block_frees", default=False))

    def has_pending_push_work(self) -> bool:
        """True if any child has push work."""
        if not self._callers["has_pending_push_work"]:
            return False
        return any(self._each("has_pending_push_work", default=False))

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        """The children's KV cache events of the step; several children's are merged."""
        if not self._callers["get_kv_connector_kv_cache_events"]:
            return None
        found = self._each("get_kv_connector_kv_cache_events")
        if found:
            found = [events for events in found if events is not None]
        if not found:
            return None
        merged: KVConnectorKVEvents = found[0]
        for events in found[1:]:
            try:
                merged = merged.merge(events)
            except Exception as exc:  # events of unlike kinds: keep the first child's
                log.warning("kvmux mux: cannot merge KV cache events: %r", exc)
        return merged

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        """The first child's handshake metadata that is not None."""
        return next(
            (m for m in self._each("get_handshake_metadata") if m is not None),
            None,
        )

    def set_xfer_handshake_metadata(
        self, metadata: dict[int, KVConnectorHandshakeMetadata]
    ) -> None:
        """Every child gets the handshake metadata."""
        self._each("set_xfer_handshake_metadata", metadata)

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        """Every child gets the PP-aware handshake metadata."""
        self._each("set_xfer_handshake_metadata_pp_aware", metadata)

    def reset_cache(self) -> bool:
        """Reset every child; True only if all succeeded."""
        return all(r is not False for r in self._each("reset_cache", default=False))

    # -- worker side ----------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Give every child the KV caches (a child may then take on per-layer work)."""
        self._each("register_kv_caches", kv_caches)
        if self._worker is not None:
            self._worker.refresh_layer_hooks()

    def unregister_kv_caches(self) -> None:
        """(vLLM 0.33+) Every child lets go of the KV caches (sleep, weight updates)."""
        self._each("unregister_kv_caches")

    def restore_kv_caches(self) -> None:
        """(vLLM 0.33+) Every child takes the KV caches back after a wake-up."""
        self._each("restore_kv_caches")

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        """Every child gets the copy ops."""
        self._each("set_host_xfer_buffer_ops", copy_operation)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Bind each child's metadata, in order."""
        KVConnectorBase_V1.bind_connector_metadata(self, connector_metadata)  # no super(): hot
        assert isinstance(connector_metadata, MuxMetadata)
        self._worker.begin_step(connector_metadata.plan, connector_metadata.children)

    def clear_connector_metadata(self) -> None:
        """Unbind every child."""
        KVConnectorBase_V1.clear_connector_metadata(self)
        self._worker.end_step()

    def has_connector_metadata(self) -> bool:
        """Whether a child has per-layer work in this step.

        vLLM asks this before each attention layer and calls ``wait_for_layer_load`` and
        ``save_kv_layer`` only if it holds, so a step in which no child works per layer
        (kvmux tiers without a layer-by-layer load, mostly) costs no call per layer.
        """
        worker = self._worker
        if worker is None:
            return KVConnectorBase_V1.has_connector_metadata(self)
        return bool(worker.layer_loads or worker.layer_saves)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Each child handles preemptions with its own metadata."""
        assert isinstance(kv_connector_metadata, MuxMetadata)
        for (child, guard), meta in zip(self._pairs, kv_connector_metadata.children, strict=True):
            if meta is not None:
                try:
                    child.handle_preemptions(meta)
                except Exception as exc:
                    guard.fail("handle_preemptions", exc)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Start every loading child's loads."""
        self._worker.start_loads(forward_context, kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Wait for every loading child that works per layer (the loop of
        ``MuxWorker.layer_loads``, here: it runs once per layer)."""
        for i, child in self._worker.layer_loads:
            try:
                child.wait_for_layer_load(layer_name)
            except Exception as exc:
                self._worker.layer_failed(i, "wait_for_layer_load", exc)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Every saving child that works per layer saves the layer (the loop of
        ``MuxWorker.layer_saves``, here: it runs once per layer)."""
        for i, child in self._worker.layer_saves:
            try:
                child.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
            except Exception as exc:
                self._worker.layer_failed(i, "save_kv_layer", exc)

    def wait_for_save(self) -> None:
        """Every saving child finishes its step's saves, once all load errors are known."""
        self._worker.save()

    def finish_forward(self) -> None:
        """Tell every child the forward pass is done."""
        self._each("finish_forward")

    def reset_capture_state(self) -> None:
        """Reset every child's capture state."""
        self._each("reset_capture_state")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Each request once, after all of its loaders (or savers) finished."""
        results = KVConnectorTransferResults()
        checkpoints: dict[str, Any] = {}
        self._worker.transfer_results(
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
        return self._worker.load_errors()

    def get_finished_count(self) -> int | None:
        """The children's common finished count, if they all state one."""
        counts = self._each("get_finished_count")
        if any(c is None for c in counts):
            return None
        if len(set(counts)) > 1:
            raise ConfigError("connectors", f"children expect different finished counts: {counts}")
        return counts[0] if counts else None

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        """Each child's worker metadata, and which children this worker has cut off."""
        metas: list[KVConnectorWorkerMetadata | None] = []
        opened: frozenset[int] = frozenset()
        for i, child, guard in self._all:
            try:
                metas.append(child.build_connector_worker_meta())
            except Exception as exc:
                guard.fail("build_connector_worker_meta", exc)
                metas.append(None)
            if not guard.closed and guard.cut_off():
                opened |= {i}
        if not opened and metas.count(None) == len(metas):
            return None
        return MuxWorkerMetadata(tuple(metas), opened)

    def get_kv_connector_stats(self) -> MuxConnectorStats | None:
        """Each child's own stats object of this interval under its label, and the mux's
        counters of every child (at most every ``COUNTERS_SECONDS``, and at once after an
        error, a breaker change, or the finish of the last running request)."""
        stats: MuxConnectorStats | None = None
        for child, guard, path in self._stats_sources:
            try:
                child_stats = child.get_kv_connector_stats()
            except Exception as exc:
                guard.fail("get_kv_connector_stats", exc)
                continue
            if child_stats is None:
                continue
            if stats is None:
                stats = MuxConnectorStats({guard.label: child_stats}, {guard.label: path})
            else:
                stats.data[guard.label] = child_stats
                stats.connectors[guard.label] = path
        now = time.monotonic()
        if now >= self._counters_due or self._notices.pending:
            self._counters_due = now + COUNTERS_SECONDS
            stats = self._add_counters(stats, now)
        return stats

    def _add_counters(
        self, stats: MuxConnectorStats | None, now: float
    ) -> MuxConnectorStats | None:
        """``stats`` with the mux's counters of the interval, unless nothing moved."""
        self._notices.pending = False
        guards = self._guards
        if stats is None and not any(guard.moved() for guard in guards):
            return None
        own = MuxCounterStats(data={guard.label: guard.take_interval() for guard in guards})
        stats = stats or MuxConnectorStats()
        stats.data[MUX_COUNTERS] = own
        if now - self._last_stats_log >= STATS_LOG_SECONDS and not stats.is_empty():
            self._last_stats_log = now
            log.info("kvmux mux stats: %s", stats.reduce())
        return stats

    def child_counters(self) -> dict[str, dict[str, float]]:
        """Each child's counters since start, by label, as this side of the mux saw them."""
        return {guard.label: guard.totals() for guard in self._guards}

    def shutdown(self) -> None:
        """Shut every child down, even if one fails."""
        for child, guard in zip(self._children, self._guards, strict=True):
            try:
                child.shutdown()  # type: ignore[no-untyped-call]
            except Exception as exc:
                guard.fail("shutdown", exc)

    def get_mem_pool_context(self) -> Any:
        """The first child's memory pool context, if any."""
        return next(
            (ctx for ctx in (c.get_mem_pool_context() for c in self._children) if ctx is not None),
            None,
        )


def _refuse_hybrid_without_hma(
    children: list[tuple[str, type[Any], Any]], kv_cache_config: Any
) -> None:
    """A model with several KV cache groups needs every child to handle them (SupportsHMA)."""
    groups = _group_count(kv_cache_config)
    if groups <= 1:
        return
    unable = [label for label, cls, _ in children if not supports_hma(cls)]
    if unable:
        raise ConfigError(
            "connectors",
            f"this model has {groups} KV cache groups (hybrid attention), which "
            f"{', '.join(unable)} cannot handle: start vLLM with "
            "--disable-hybrid-kv-cache-manager, or use only children that support HMA",
        )


def _delivers(child: KVConnectorBase_V1) -> bool:
    """The child's ``requires_kv_delivery``."""
    return bool(child.requires_kv_delivery)


def _divergent(child: KVConnectorBase_V1) -> bool:
    """The child's ``supports_divergent_local_hybrid_hits``."""
    return bool(child.supports_divergent_local_hybrid_hits)


def _overriding(children: list[Child], hook: str) -> list[Child]:
    """The children that may do something in ``hook``: their class overrides the base
    class's no-op, the instance has its own, or the class intercepts every attribute
    (a ``__getattribute__`` wrapper, as vLLM's own MultiConnector tests record calls)."""
    base = getattr(KVConnectorBase_V1, hook)
    return [child for child in children if _may_override(child[1], hook, base)]


def _may_override(connector: Any, hook: str, base: Any) -> bool:
    cls = type(connector)
    if getattr(cls, hook, None) is not base or hook in getattr(connector, "__dict__", {}):
        return True
    intercepts: Any = cls.__getattribute__
    return intercepts is not object.__getattribute__


def _group_count(kv_cache_config: KVCacheConfig | None) -> int:
    """How many KV cache groups the model has (0 when vLLM gives no KV cache config)."""
    return len(getattr(kv_cache_config, "kv_cache_groups", None) or ())
