"""Per-step time MuxConnector and vLLM's MultiConnector add over the same children.

In-process and engine-free: both connectors get the same stand-in children, and a driver
runs the hooks vLLM calls in one scheduler step (new requests looked up and allocated,
metadata built, the workers' output taken in, finished requests, stats, events) and in
one worker step (bind, loads, every layer's hooks, saves, transfer results, load errors,
stats, events, worker metadata, clear). Each child hook is wrapped with a timer, as the
engine runner's ``instrument`` op does; what a connector adds is its own time minus its
children's. MuxConnector and MultiConnector are measured in alternation, round by round,
and compared by ratio: the absolute numbers depend on the machine and its load.

The timer around each child call costs its caller a little beyond the call itself; that
is measured (``timing_overhead``) and subtracted per call, so a connector that calls its
children more often is not charged for the measurement.

``python -m benchmarks.hooks [--children 1,2,4] [--kind tier,foreign]
[--workload decode,prefill]`` prints a table. Children of kind ``tier`` behave like kvmux
tiers (no per-layer work, loads at any offset); ``foreign`` ones like other connectors
(per-layer hooks that MuxConnector must call too).
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.outputs import KVConnectorOutput

from kvmux.mux.capabilities import Capabilities
from kvmux.vllm.mux_connector import MuxConnector

__all__ = ["WORKLOADS", "BenchSettings", "format_table", "main", "measure_hooks"]

BLOCK = 16
SCHEDULER_HOOKS = (
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "get_external_cache_hit_sources",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "get_kv_connector_stats",
    "take_events",
    "has_pending_push_work",
)
WORKER_HOOKS = (
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta",
    "clear_connector_metadata",
    "mux_drop_saves_over",  # MuxConnector's own: a kvmux tier's work, so children's time
)


# -- stand-in children ---------------------------------------------------------------------


@dataclass
class BenchMeta(KVConnectorMetadata):
    """A stand-in child's step: the requests it loads."""

    loads: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class BenchStats(KVConnectorStats):
    """A stand-in child's counters of an interval."""

    def reset(self) -> None:
        """Clear the interval."""
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Sum the counters."""
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        """The counters."""
        return dict(self.data)

    def is_empty(self) -> bool:
        """True when nothing moved."""
        return not any(self.data.values())


class BenchChild(KVConnectorBase_V1):
    """A cheap child: offers what the driver scripted per request, plans its loads, counts
    what it loaded and saved. It overrides the hooks a kvmux tier overrides."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.index = int(self._kv_transfer_config.kv_connector_extra_config["index"])
        self._loads: list[tuple[str, int]] = []
        self._counts: dict[str, int] = {}  # since the last stats
        self.totals: dict[str, int] = {}  # since the start

    def _count(self, name: str, value: int = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + value
        self.totals[name] = self.totals.get(name, 0) + value

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """The scripted offer past the computed tokens."""
        self._count("lookups")
        return max(0, request.offers[self.index] - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Plan the load of the tokens the connector was chosen for."""
        if num_external_tokens:
            self._loads.append((request.request_id, num_external_tokens))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """The step's loads."""
        meta, self._loads = BenchMeta(self._loads), []
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        """Read the workers' metadata (a tier forgets keys they could not load)."""
        if connector_output.kv_connector_worker_meta is not None:
            self._count("missing")

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        """Saves are done within the step."""
        self._count("finished")
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Count the planned loads."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, BenchMeta)
        self._count("loaded", len(meta.loads))

    def wait_for_save(self) -> None:
        """Count one step's save."""
        self._count("saved")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Nothing asynchronous."""
        return KVConnectorTransferResults()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """No load errors."""
        return set()

    def build_connector_worker_meta(self) -> None:
        """Every key loaded."""

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The counters since the last call."""
        if not self._counts:
            return None
        stats, self._counts = BenchStats(data=self._counts), {}
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        """Rebuild sent stats."""
        return BenchStats(data=dict(data or {}))


class BenchTier(BenchChild):
    """Like a kvmux tier: loads at any offset, whole steps at once (nothing per layer), and
    hears which blocks a sibling failed to load."""

    def mux_capabilities(self) -> Capabilities:
        """Loads at any offset; nothing per layer; drops saves over a sibling's failure."""
        return Capabilities(offset_loads=True, layer_loads=False, drops_saves=True)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing per layer."""

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        """Nothing per layer."""

    def mux_drop_saves_over(self, block_ids: set[int]) -> None:
        """Blocks a sibling failed to load (MuxConnector tells it before the saves)."""
        self._count("dropped", len(block_ids))


class BenchForeign(BenchChild):
    """Like most other connectors: loads from the computed tokens on, works per layer."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        """A little work per layer."""
        self._count("layers")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        """A little work per layer."""
        self._count("layers")


# -- building the connectors -----------------------------------------------------------------


def _vllm_config(top: str, children: int, kind: str) -> Any:
    child = "BenchTier" if kind == "tier" else "BenchForeign"
    ktcs = [
        {
            "kv_connector": child,
            "kv_connector_module_path": __name__,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"index": i},
        }
        for i in range(children)
    ]
    ktc = KVTransferConfig(
        kv_connector=top,
        kv_connector_module_path="kvmux.vllm" if top == "MuxConnector" else None,
        kv_role="kv_both",
        engine_id="bench",
        kv_connector_extra_config={"connectors": ktcs},
    )
    return SimpleNamespace(
        kv_transfer_config=ktc,
        cache_config=SimpleNamespace(block_size=BLOCK),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=True),
    )


def _children_of(connector: Any) -> list[Any]:
    if isinstance(connector, MuxConnector):
        return connector.children
    return list(connector._connectors)


class Timers:
    """Seconds spent in the top connector's hooks and in its children's, by side, and how
    many child hooks were called (each call's timing costs the top a little: see
    ``timing_overhead``)."""

    def __init__(self) -> None:
        self.top = 0.0
        self.children = 0.0
        self.calls = 0

    def wrap_children(self, connector: Any, hooks: tuple[str, ...]) -> None:
        """Time every hook of every child (an instance attribute hides the method)."""
        for child in _children_of(connector):
            for name in hooks:
                if hasattr(child, name):
                    setattr(child, name, self._timed(getattr(child, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return method(*args, **kwargs)
            finally:
                self.children += clock() - started
                self.calls += 1

        return timed

    def reset(self) -> None:
        """Start counting again."""
        self.top = self.children = 0.0
        self.calls = 0


def timing_overhead(calls: int = 200_000) -> float:
    """Seconds a timed child call costs its caller beyond an untimed call: the wrapper's
    own work outside the window it times (the least of a few tries)."""

    def noop() -> None:
        pass

    timers = Timers()
    timed = timers._timed(noop)
    clock = time.perf_counter
    best = float("inf")
    for _ in range(5):
        started = clock()
        for _ in range(calls):
            noop()
        direct = clock() - started
        timers.reset()
        started = clock()
        for _ in range(calls):
            timed()
        wrapped = clock() - started
        best = min(best, (wrapped - timers.children - direct) / calls)
    return max(best, 0.0)


@dataclass
class Pair:
    """One connector's two halves, fed by one driver."""

    name: str
    scheduler: Any
    worker: Any
    sched_timers: Timers = field(default_factory=Timers)
    worker_timers: Timers = field(default_factory=Timers)

    @classmethod
    def build(cls, top: str, children: int, kind: str) -> Pair:
        """Both halves of ``top`` over ``children`` stand-in children of ``kind``."""
        connector: Any = MuxConnector if top == "MuxConnector" else MultiConnector
        config = _vllm_config(top, children, kind)
        pair = cls(
            top,
            scheduler=connector(config, KVConnectorRole.SCHEDULER, None),
            worker=connector(config, KVConnectorRole.WORKER, None),
        )
        pair.sched_timers.wrap_children(pair.scheduler, SCHEDULER_HOOKS)
        pair.worker_timers.wrap_children(pair.worker, WORKER_HOOKS)
        return pair


# -- the driver ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchSettings:
    """The workload of a step and the size of the measurement."""

    arrivals: float = 0.5  # requests arriving (looked up, allocated) per step
    lifetime: int = 32  # steps a request runs (then it finishes): arrivals * lifetime run
    hit_tokens: int = 4 * BLOCK  # what a child offers when it holds a request
    layers: int = 8  # per-layer hooks per worker step
    steps: int = 50  # steps per connector per round
    rounds: int = 40  # rounds, each connector measured once per round
    warmup_steps: int = 50


@dataclass
class _Request:
    request_id: str
    offers: tuple[int, ...]


class Driver:
    """Feeds one connector pair the same steps as any other pair with as many children."""

    def __init__(self, pair: Pair, children: int, settings: BenchSettings):
        self.pair = pair
        self.children = children
        self.settings = settings
        self.step = 0
        self.arrived = 0  # requests so far
        self.live: list[tuple[int, _Request]] = []  # (step it finishes at, request)
        self.finished_ids: set[str] = set()
        self.worker_output = KVConnectorOutput()
        self.forward = SimpleNamespace(name="forward-context")
        self.kv_layer = torch.zeros(1)
        self.attn = SimpleNamespace(name="attn-metadata")
        self.layers = [f"model.layers.{i}.self_attn.attn" for i in range(settings.layers)]

    def _new_requests(self) -> list[_Request]:
        made = []
        due = int((self.step + 1) * self.settings.arrivals) - self.arrived
        for n in range(self.arrived, self.arrived + due):
            holder = n % (self.children + 1)  # one child holds it, or none does
            offers = tuple(
                self.settings.hit_tokens if i == holder else 0 for i in range(self.children)
            )
            made.append(_Request(f"req-{n}", offers))
        self.arrived += due
        return made

    def run(self, steps: int) -> None:
        """``steps`` scheduler and worker steps."""
        for _ in range(steps):
            meta = self._schedule()
            self._execute(meta)
            self._update()
            self.step += 1

    def _schedule(self) -> Any:
        conn, timers, clock = self.pair.scheduler, self.pair.sched_timers, time.perf_counter
        first = self.step * 8  # vLLM's own blocks: reading their ids has a cost too
        blocks = KVCacheBlocks(([KVCacheBlock(i) for i in range(first, first + 8)],))
        new = self._new_requests()
        started = clock()
        for request in new:
            conn.on_new_request(request)
            tokens, _ = conn.get_num_new_matched_tokens(request, 0)
            conn.update_state_after_alloc(request, blocks, tokens or 0)
            if tokens:
                conn.get_external_cache_hit_sources(request, tokens)
        meta = conn.build_connector_meta(SimpleNamespace(finished_req_ids=self.finished_ids))
        timers.top += clock() - started
        self.live.extend((self.step + self.settings.lifetime, r) for r in new)
        return meta

    def _execute(self, meta: Any) -> None:
        conn, timers, clock = self.pair.worker, self.pair.worker_timers, time.perf_counter
        kv_layer, attn = self.kv_layer, self.attn
        started = clock()
        conn.bind_connector_metadata(meta)
        conn.start_load_kv(self.forward)
        for layer in self.layers:
            if conn.has_connector_metadata():
                conn.wait_for_layer_load(layer)
                conn.save_kv_layer(layer, kv_layer, attn)
        conn.wait_for_save()
        results = conn.get_transfer_results(self.finished_ids)
        output = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            invalid_block_ids=conn.get_block_ids_with_load_errors(),
        )
        output.kv_connector_stats = conn.get_kv_connector_stats()
        output.kv_cache_events = conn.get_kv_connector_kv_cache_events()
        output.kv_connector_worker_meta = conn.build_connector_worker_meta()
        conn.clear_connector_metadata()
        timers.top += clock() - started
        self.worker_output = output

    def _update(self) -> None:
        conn, timers, clock = self.pair.scheduler, self.pair.sched_timers, time.perf_counter
        done = [r for end, r in self.live if end <= self.step]
        self.live = self.live[len(done) :]
        started = clock()
        conn.update_connector_output(self.worker_output)
        for request in done:
            conn.request_finished(request, [])
        conn.get_kv_connector_stats()
        list(conn.take_events())
        conn.has_pending_push_work()
        timers.top += clock() - started
        self.finished_ids = {r.request_id for r in done}


# -- measurement -----------------------------------------------------------------------------


def _added_per_step(pair: Pair, steps: int, overhead: float) -> tuple[float, float]:
    """Added microseconds per step (scheduler, worker) since the timers were last read:
    the top's time less its children's and less what timing the children cost it."""
    added = []
    for timers in (pair.sched_timers, pair.worker_timers):
        own = timers.top - timers.children - timers.calls * overhead
        added.append(1e6 * own / steps)
        timers.reset()
    return added[0], added[1]


def _rounds(
    drivers: list[Driver], settings: BenchSettings, overhead: float
) -> Iterator[list[tuple[float, float]]]:
    for driver in drivers:
        driver.run(settings.warmup_steps)
        _added_per_step(driver.pair, 1, overhead)
    for r in range(settings.rounds):
        order = drivers if r % 2 == 0 else drivers[::-1]
        gc.collect()
        found: dict[str, tuple[float, float]] = {}
        for driver in order:
            driver.run(settings.steps)
            found[driver.pair.name] = _added_per_step(driver.pair, settings.steps, overhead)
        yield [found[d.pair.name] for d in drivers]


def measure_hooks(
    children: int,
    kind: str = "tier",
    settings: BenchSettings | None = None,
    overhead: float | None = None,
) -> dict[str, Any]:
    """MuxConnector's and MultiConnector's added time per step over the same children.

    ``overhead``: what timing one child call costs the caller (``timing_overhead()`` by
    default; 0 counts it as the connector's, as the engine runner's ``instrument`` does).
    """
    settings = settings or BenchSettings()
    overhead = timing_overhead() if overhead is None else overhead
    drivers = [
        Driver(Pair.build(top, children, kind), children, settings)
        for top in ("MuxConnector", "MultiConnector")
    ]
    rounds = list(_rounds(drivers, settings, overhead))
    row: dict[str, Any] = {
        "children": children,
        "kind": kind,
        "arrivals": settings.arrivals,
        "lifetime": settings.lifetime,
        "rounds": len(rounds),
        "timing_overhead_ns": 1e9 * overhead,
    }
    for s, side in enumerate(("scheduler", "worker")):
        mux = [r[0][s] for r in rounds]
        multi = [r[1][s] for r in rounds]
        row[f"{side}_mux_us"] = statistics.median(mux)
        row[f"{side}_multi_us"] = statistics.median(multi)
        row[f"{side}_ratio"] = statistics.median(a / b for a, b in zip(mux, multi, strict=True))
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``measure_hooks`` rows: added µs per step and Mux / Multi."""
    lines = [
        "| children | kind | arrivals/step | scheduler: Mux | Multi | ratio "
        "| worker: Mux | Multi | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['children']} | {r['kind']} | {r['arrivals']:g} "
            f"| {r['scheduler_mux_us']:.1f} | {r['scheduler_multi_us']:.1f} "
            f"| {r['scheduler_ratio']:.2f} | {r['worker_mux_us']:.1f} "
            f"| {r['worker_multi_us']:.1f} | {r['worker_ratio']:.2f} |"
        )
    return "\n".join(lines)


WORKLOADS = {  # name: (arrivals per step, steps a request runs)
    "decode": (0.5, 32),  # 16 requests running, one arriving every other step
    "prefill": (4.0, 4),  # 16 running, 4 arriving every step: lookups dominate
}


def main(argv: list[str] | None = None) -> int:
    """Print the table for the workloads, kinds and children counts asked for."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hooks", description=__doc__)
    parser.add_argument("--children", default="1,2,4", help="comma-separated children counts")
    parser.add_argument("--kind", default="tier", help="tier, foreign, or both: tier,foreign")
    parser.add_argument(
        "--workload", default="decode,prefill", help=f"some of {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--rounds", type=int, default=BenchSettings.rounds)
    parser.add_argument("--steps", type=int, default=BenchSettings.steps, help="per round")
    parser.add_argument("--layers", type=int, default=BenchSettings.layers)
    parser.add_argument(
        "--as-instrumented",
        action="store_true",
        help="count what timing each child call costs as the connector's (as the engine "
        "runner's instrument op does) instead of subtracting it",
    )
    args = parser.parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)  # one warning per connector made
    overhead = 0.0 if args.as_instrumented else timing_overhead()
    rows = []
    for workload in args.workload.split(","):
        arrivals, lifetime = WORKLOADS[workload]
        settings = BenchSettings(
            arrivals=arrivals,
            lifetime=lifetime,
            layers=args.layers,
            steps=args.steps,
            rounds=args.rounds,
        )
        rows += [
            measure_hooks(int(n), kind, settings, overhead)
            for kind in args.kind.split(",")
            for n in args.children.split(",")
        ]
    print(format_table(rows))
    print(f"(timing a child call costs its caller {1e9 * overhead:.0f} ns: subtracted)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
