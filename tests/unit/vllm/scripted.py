"""A scripted vLLM KV connector for MuxConnector's unit tests.

``ScriptedConnector`` is a real ``KVConnectorBase_V1`` subclass that vLLM's factory loads
through ``kv_connector_module_path="tests.unit.vllm.scripted"``. Its behaviour comes from
its ``kv_connector_extra_config`` (copied once per ``name`` into ``SCRIPTS``, which the tests
may change while running), and it records every call in ``CALLS[name]``.

Script keys (all optional):

    name              key of SCRIPTS and CALLS (default "scripted")
    offer             tokens offered by get_num_new_matched_tokens: an int, None ("still
                      looking") or a mapping {start: int | None}; default 0
    async             is_async of the lookup (only when the offer is > 0)
    raise_in          hook names that raise ScriptedError
    async_save        request_finished returns True
    params            kv_transfer_params returned by request_finished
    layout            get_required_kvcache_layout's answer
    piecewise         requires_piecewise_for_cudagraph's answer
    offset_capable    Capabilities.offset_loads, which MuxConnector reads
    finished_sending  request ids get_transfer_results reports (one shot, then cleared)
    finished_recving  ditto
    failed_recving    ditto
    load_errors       block ids get_block_ids_with_load_errors reports (one shot)
    events            what take_events returns (one shot)
    finished_count    get_finished_count's answer
    reset             reset_cache's answer
    stats             data of the ScriptedStats get_kv_connector_stats returns
    worker_meta       a set of tags: build_connector_worker_meta returns ScriptedWorkerMeta
    needs_meta        Capabilities.output_needs_meta (as a kvmux tier's)
    publishes_events  Capabilities.publishes_events (as a kvmux tier's)
    checkpoints       {req_id: checkpoint}: get_transfer_results's prefix_replay_checkpoints
                      (a field of vLLM main's results; one shot)
    replay_checkpoint the answer of can_load_/consume_prefix_replay_checkpoint (vLLM main)
    partial_tail      register_finished_partial_tail's answer
    kv_delivery       requires_kv_delivery (default: vLLM's, the producer role)
    divergent         supports_divergent_local_hybrid_hits (default False)
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from kvmux.mux.capabilities import Capabilities

MODULE = __name__  # the kv_connector_module_path of the scripted children

SCRIPTS: dict[str, dict[str, Any]] = {}
CALLS: dict[str, list[Call]] = defaultdict(list)
ORDER: list[tuple[str, str]] = []  # (name, hook) of every call of every child, in order


class ScriptedError(RuntimeError):
    """What a scripted child raises in the hooks named by raise_in."""


@dataclass(frozen=True)
class Call:
    """One recorded hook call."""

    role: str  # "SCHEDULER" or "WORKER"
    hook: str
    args: tuple[Any, ...]


@dataclass
class ScriptedMetadata(KVConnectorMetadata):
    """What the scheduler-side child hands its worker-side twin each step."""

    name: str
    step: int
    loads: list[tuple[str, int]] = field(default_factory=list)  # (req_id, tokens)
    named: list[int] = field(default_factory=list)  # block ids it names as its loads


@dataclass
class ScriptedWorkerMeta(KVConnectorWorkerMetadata):
    """Tags sent from a worker-side child back to its scheduler-side twin."""

    tags: frozenset[str]

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, ScriptedWorkerMeta)
        return ScriptedWorkerMeta(self.tags | other.tags)


@dataclass
class ScriptedStats(KVConnectorStats):
    """Numbers are summed; lists are observations, reduced to their mean (``avg_<key>``)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            empty: Any = [] if isinstance(value, list) else 0
            self.data[key] = self.data.get(key, empty) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        reduced: dict[str, int | float] = {}
        for key, value in self.data.items():
            if isinstance(value, list):
                reduced[f"avg_{key}"] = sum(value) / len(value) if value else 0.0
            else:
                reduced[key] = value
        return reduced

    def is_empty(self) -> bool:
        return not any(self.data.values())


class ScriptedProm(KVConnectorPromMetrics):
    """A child's own Prometheus metrics: ``scripted_hits_total`` per engine."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        counter_cls: Any = self._counter_cls
        hits = counter_cls(
            name="scripted_hits_total", documentation="hits", labelnames=self._labelnames
        )
        self.hits = {i: hits.labels(*v) for i, v in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        self.hits[engine_idx].inc(transfer_stats_data.get("hits", 0))


def reset() -> None:
    """Forget every script and recorded call."""
    SCRIPTS.clear()
    CALLS.clear()
    ORDER.clear()


def calls(name: str, hook: str | None = None, role: str | None = None) -> list[Call]:
    """The recorded calls of child ``name``, optionally of one hook and role."""
    return [
        c
        for c in CALLS.get(name, [])
        if (hook is None or c.hook == hook) and (role is None or c.role == role)
    ]


def args_of(name: str, hook: str, role: str | None = None) -> list[tuple[Any, ...]]:
    """The arguments of every call of ``hook`` on child ``name``."""
    return [c.args for c in calls(name, hook, role)]


def _extra(vllm_config: Any) -> dict[str, Any]:
    return dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})


class ScriptedConnector(KVConnectorBase_V1):
    """Does what its script says and records everything."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = _extra(vllm_config)
        self.name = str(extra.get("name", "scripted"))
        self.script = SCRIPTS.setdefault(self.name, copy.deepcopy(extra))
        self.capabilities = Capabilities(  # what MuxConnector reads (mux/capabilities.py)
            offset_loads=bool(self.script.get("offset_capable", False)),
            names_load_blocks="names_loads" in self.script,  # as a kvmux tier's metadata
            output_needs_meta=bool(self.script.get("needs_meta", False)),
            publishes_events=bool(self.script.get("publishes_events", True)),
            drops_saves=True,
        )
        self.kv_transfer_config = vllm_config.kv_transfer_config
        self._loads: list[tuple[str, int]] = []
        self._step = 0
        self._record("__init__", self.kv_transfer_config)

    def mux_capabilities(self) -> Capabilities:
        return self.capabilities

    def declare(self, **changes: Any) -> None:
        """Change what this child states to MuxConnector (``Capabilities`` fields)."""
        self.capabilities = replace(self.capabilities, **changes)

    def mux_load_blocks(self, meta: Any) -> list[int]:
        return self._named_loads(meta)

    @staticmethod
    def _named_loads(meta: ScriptedMetadata) -> list[int]:
        return list(meta.named)

    # -- helpers -----------------------------------------------------------------

    def _record(self, hook: str, *args: Any) -> None:
        CALLS[self.name].append(Call(self._role.name, hook, args))
        ORDER.append((self.name, hook))
        if hook in self.script.get("raise_in", ()):
            raise ScriptedError(f"{self.name} scripted failure in {hook}")

    def _take(self, key: str) -> list[Any]:
        values = list(self.script.get(key) or ())
        self.script[key] = []
        return values

    # -- class-level ---------------------------------------------------------------

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        return _extra(vllm_config).get("layout")

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return bool(extra_config.get("piecewise", False))

    @classmethod
    def build_prom_metrics(
        cls, vllm_config: Any, metric_types: Any, labelnames: Any, per_engine_labelvalues: Any
    ) -> KVConnectorPromMetrics:
        return ScriptedProm(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> ScriptedStats:
        return ScriptedStats(data=dict(data or {}))

    # -- scheduler side ---------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._record("get_num_new_matched_tokens", request.request_id, num_computed_tokens)
        offer = self.script.get("offer", 0)
        if isinstance(offer, dict):
            offer = offer.get(num_computed_tokens, 0)
        if offer is None:
            return None, False
        return int(offer), bool(offer) and bool(self.script.get("async", False))

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        block_ids = list(blocks.get_block_ids()[0])
        self._record("update_state_after_alloc", request.request_id, block_ids, num_external_tokens)
        if num_external_tokens:
            self._loads.append((request.request_id, num_external_tokens))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self._record("build_connector_meta", scheduler_output)
        self._step += 1
        named = list(self.script.get("names_loads", [])) if self._loads else []
        meta = ScriptedMetadata(self.name, self._step, self._loads, named)
        self._loads = []
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        self._record(
            "update_connector_output", connector_output, connector_output.kv_connector_worker_meta
        )

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        self._record("request_finished", request.request_id, list(block_ids))
        params = self.script.get("params")
        return bool(self.script.get("async_save", False)), copy.deepcopy(params)

    def take_events(self) -> list[Any]:
        self._record("take_events")
        return self._take("events")

    @property
    def requires_kv_delivery(self) -> bool:
        self._record("requires_kv_delivery")
        default = KVConnectorBase_V1.requires_kv_delivery.fget(self)  # type: ignore[attr-defined]
        return bool(self.script.get("kv_delivery", default))

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        self._record("supports_divergent_local_hybrid_hits")
        return bool(self.script.get("divergent", False))

    def register_finished_partial_tail(
        self, request: Any, block_ids: Any, partial_tail_offloads: Any
    ) -> bool:
        self._record("register_finished_partial_tail", request.request_id, partial_tail_offloads)
        return bool(self.script.get("partial_tail", False))

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[Any, Any]) -> None:
        self._record("set_xfer_handshake_metadata_pp_aware", dict(metadata))

    def can_load_prefix_replay_checkpoint(
        self, request: Any, num_local_tokens: int, num_external_tokens: int
    ) -> bool:
        self._record(
            "can_load_prefix_replay_checkpoint",
            request.request_id,
            num_local_tokens,
            num_external_tokens,
        )
        return bool(self.script.get("replay_checkpoint", False))

    def consume_prefix_replay_checkpoint(self, request: Any, num_hit_tokens: int) -> bool:
        self._record("consume_prefix_replay_checkpoint", request.request_id, num_hit_tokens)
        return bool(self.script.get("replay_checkpoint", False))

    def reset_cache(self) -> bool | None:
        self._record("reset_cache")
        return self.script.get("reset", True)

    # -- worker side ------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._record("bind_connector_metadata", connector_metadata)
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._record("clear_connector_metadata")
        super().clear_connector_metadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._record("start_load_kv", forward_context)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._record("wait_for_layer_load", layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any):
        self._record("save_kv_layer", layer_name)

    def wait_for_save(self) -> None:
        self._record("wait_for_save")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        self._record("get_transfer_results", set(finished_req_ids))
        failed = set(self._take("failed_recving"))
        results = KVConnectorTransferResults(
            finished_sending=set(self._take("finished_sending")),
            finished_recving=set(self._take("finished_recving")) | failed,
            failed_recving=failed,
        )
        checkpoints = self.script.get("checkpoints")
        if checkpoints:  # a field of vLLM main's results, an attribute before
            self.script["checkpoints"] = {}
            results.prefix_replay_checkpoints = dict(checkpoints)  # type: ignore[attr-defined]
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._record("get_block_ids_with_load_errors")
        return set(self._take("load_errors"))

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        self._record("handle_preemptions", kv_connector_metadata)

    def mux_drop_saves_over(self, block_ids: set[int]) -> None:
        self._record("mux_drop_saves_over", set(block_ids))

    def get_finished_count(self) -> int | None:
        self._record("get_finished_count")
        return self.script.get("finished_count")

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        self._record("build_connector_worker_meta")
        tags = self.script.get("worker_meta")
        return None if tags is None else ScriptedWorkerMeta(frozenset(tags))

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        self._record("get_kv_connector_stats")
        data = self.script.get("stats")
        return None if data is None else ScriptedStats(data=dict(data))

    def shutdown(self) -> None:
        self._record("shutdown")


class ScriptedHMAConnector(ScriptedConnector, SupportsHMA):
    """A scripted child that handles models with several KV cache groups."""

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Any]:
        self._record("request_finished_all_groups", request.request_id, block_ids)
        params = self.script.get("params")
        return bool(self.script.get("async_save", False)), copy.deepcopy(params)
