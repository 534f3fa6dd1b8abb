"""Store faults inside real vLLM: a fault is a counted miss, never a crash, never wrong tokens.

One engine per tier (memory, disk, Redis, and MuxConnector over memory and disk) walks
through the faults in sequence: a clean warm-up stores the prompts, then each phase
switches the faults of a FaultyStore (tests/support/faulty_store.py) and sends requests
that would hit the tier. The test switches faults from this process between engine
steps: the engine touches ``ask-N`` and waits for ``go-N``, which is touched once the
control files are written.

Oracles, per phase: every output equals a run without connector, token for token and in
log-probability (float32); every injected StoreError is exactly one ``store_errors``;
every value that failed to load (raised, corrupt, truncated, evicted) is one
``load_errors``; every write refused is one ``save_errors``.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import generate, make_prompt, results, store_kv
from tests.support.engine_log import unexpected_tracebacks
from tests.support.faulty_store import FaultSpec, read_record, write_control

pytestmark = pytest.mark.vllm

Run = Callable[..., dict[str, Any]]
BLOCK = 128  # the CPU backend's block size
LOGPROB_TOLERANCE = 1e-3
SETTLE = 0.2  # seconds for the writer threads to finish a phase's saves
REFRESH_PAUSE = 1.2  # past RemoteStoreView.GENERATION_REFRESH_SECONDS: a refresh is due
BLOCK_ENTRY = 2 * 128 * 2 * 32 * 4 * 2  # the tiny Llama's block: one memory-tier slot

LONG = make_prompt(71, 10 * BLOCK + 1)
PROMPTS = {
    "W": make_prompt(69, 2 * BLOCK + 1),  # a first request, to wake a Redis tier up
    "P": make_prompt(70, 7 * BLOCK + 4),  # the prompt every read fault is tried on
    "Q": make_prompt(72, 7 * BLOCK + 4),  # fresh prompts for the write faults
    "R": make_prompt(73, 7 * BLOCK + 4),
    "LONG": LONG,  # 10 blocks: more than the mux's memory tier holds
    "HEAD": LONG[: 5 * BLOCK + 1],  # its first 5 blocks: exactly what that tier holds
}
HITS = 7 * BLOCK  # P's full blocks below its last token
LONG_HIT = 10 * BLOCK


@dataclass(frozen=True)
class Phase:
    """Faults written to control files, then requests sent under them."""

    name: str
    faults: dict[str, dict[str, Any]]  # control file name -> fault spec
    prompts: tuple[str, ...]
    cached: tuple[int | None, ...] = ()  # expected num_cached_tokens per prompt (None: any)
    exact_loads: bool = True  # False: a load may also fail for an earlier fault's sake
    pause: float = 0.0  # seconds slept after switching, before the requests

    @property
    def faulty(self) -> bool:
        """Whether some control file names a fault."""
        return any(spec["fault"] != "none" for spec in self.faults.values())


def tier_phases(control: str, memory: bool = False) -> list[Phase]:
    """The walk of one tier: warm-up, each fault in turn, then clean checks.

    The lookup blip is for shared tiers only: a memory tier looks up its own index, not
    the store.
    """

    def phase(name: str, prompt: str, **spec: Any) -> Phase:
        return Phase(name, {control: spec}, (prompt,))

    none = {control: {"fault": "none"}}
    # a memory tier's slots are the engine's own memory: nothing else writes them
    corruption = [
        phase("corrupt", "P", fault="corrupt"),
        phase("truncate", "P", fault="truncate"),
    ]
    spoiled = [phase("corrupt-some", "P", fault="corrupt", fraction=0.5, seed=3)]
    if memory:
        corruption, spoiled = [], [phase("evict-some", "P", fault="evict", fraction=0.5, seed=3)]
    phases = [
        # W first: a Redis tier neither loads nor saves a request before its generation
        # is known, which its first request only starts to read
        Phase("warm", none, ("W", "P", "P"), cached=(None, 0, HITS)),
        phase("error-get", "P", fault="error", on=["get"]),
        Phase("latency", {control: {"fault": "latency", "ms": 20}}, ("P",), cached=(HITS,)),
        *corruption,
        phase("evict", "P", fault="evict"),
        *spoiled,
        phase("enospc", "Q", fault="enospc"),
        phase("error-put", "R", fault="error", on="writes"),
        phase("unavailable-reads", "P", fault="error", on="reads", error="unavailable"),
        # past a Redis tier's generation refresh, W lets it read the generation again
        Phase(
            "recovered",
            none,
            ("W", "P", "Q", "Q", "R"),
            cached=(None, HITS, None, HITS, None),
            pause=REFRESH_PAUSE,
        ),
    ]
    if not memory:  # one failed lookup (a generation refresh included), then none
        blip = {control: {"fault": "error", "on": ["lookup"]}}
        phases.append(Phase("lookup-blip", blip, ("P",), pause=REFRESH_PAUSE))
        phases.append(Phase("after-blip", none, ("P",), cached=(HITS,)))
    return phases


def mux_phases() -> list[Phase]:
    """Memory (holds 5 blocks) then disk, composed: LONG loads 5 blocks from each."""

    def both(name: str, memory: dict[str, Any], disk: dict[str, Any], **kw: Any) -> Phase:
        prompts = kw.pop("prompts", ("HEAD", "LONG"))
        return Phase(name, {"memory.json": memory, "disk.json": disk}, prompts, **kw)

    none = {"fault": "none"}
    return [
        both("warm", none, none, prompts=("LONG", "HEAD", "LONG"), cached=(0, 5 * BLOCK, LONG_HIT)),
        both("memory-error-get", {"fault": "error", "on": ["get"]}, none),
        both("memory-evict", {"fault": "evict"}, none),
        both("memory-error-put", {"fault": "error", "on": "writes"}, none),
        both("disk-error-get", none, {"fault": "error", "on": ["get"]}),
        both(
            "disk-unavailable-reads",
            none,
            {"fault": "error", "on": "reads", "error": "unavailable"},
        ),
        both("disk-truncate", none, {"fault": "truncate"}),
        both("disk-enospc", none, {"fault": "enospc"}, prompts=("Q",)),
        both(
            "recovered",
            none,
            none,
            prompts=("HEAD", "LONG", "Q", "Q"),
            cached=(5 * BLOCK, LONG_HIT, 0, HITS),
        ),
    ]


PHASES = {  # each tier's walk: one engine each
    "memory": tier_phases("tier.json", memory=True),
    "disk": tier_phases("tier.json"),
    "redis": tier_phases("tier.json"),
    "mux": mux_phases(),
}


# -- running a walk ----------------------------------------------------------------


@dataclass
class Walk:
    """One engine's walk through its phases, split per phase."""

    phases: list[Phase]
    outputs: dict[str, list[dict[str, Any]]]  # phase -> its generate results
    delta: dict[str, dict[str, dict[str, float]]]  # phase -> tier -> counter deltas
    injected: dict[str, list[dict[str, Any]]]  # phase -> record lines
    run: dict[str, Any] = field(repr=False)


def _steps(phases: list[Phase], folder: Path) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for i, phase in enumerate(phases):
        steps += [
            {"op": "touch", "path": str(folder / f"ask-{i}")},
            {"op": "wait_file", "path": str(folder / f"go-{i}"), "timeout": 60},
        ]
        if phase.pause:
            steps.append({"op": "sleep", "seconds": phase.pause})
        steps += [generate(PROMPTS[p], logprobs=True) for p in phase.prompts]
        steps += [{"op": "sleep", "seconds": SETTLE}, {"op": "stats"}]
    return steps


def _drive(phases: list[Phase], folder: Path, record: Path, stop: threading.Event) -> None:
    """Write each phase's control files when the engine asks for them."""
    for i, phase in enumerate(phases):
        while not (folder / f"ask-{i}").exists():
            if stop.wait(0.02):
                return
        for control, spec in phase.faults.items():
            write_control(folder / control, **spec, phase=phase.name, record=str(record))
        (folder / f"go-{i}").touch()


def walk(run_job: Run, kv: dict[str, Any], phases: list[Phase], folder: Path) -> Walk:
    """Run the phases in one engine; split outputs, counters and injections per phase."""
    record = folder / "record.jsonl"
    for phase in phases:  # a bad spec fails here, not in the driver the engine waits for
        for spec in phase.faults.values():
            FaultSpec.parse(spec)
    stop = threading.Event()
    driver = threading.Thread(target=_drive, args=(phases, folder, record, stop), daemon=True)
    driver.start()
    try:
        run = run_job(_steps(phases, folder), kv=kv, enable_prefix_caching=False)
    finally:
        stop.set()
        driver.join()
    generated = iter(results(run))
    outputs = {p.name: [next(generated) for _ in p.prompts] for p in phases}
    before: dict[str, dict[str, float]] = {}
    delta = {}
    for phase, snapshot in zip(phases, results(run, "stats"), strict=True):
        after = snapshot["stats"]
        delta[phase.name] = {
            tier: {k: v - before.get(tier, {}).get(k, 0) for k, v in counters.items()}
            for tier, counters in after.items()
        }
        before = after
    injected: dict[str, list[dict[str, Any]]] = {p.name: [] for p in phases}
    for line in read_record(record):
        injected[line["phase"]].append(line)
    return Walk(phases, outputs, delta, injected, run)


def expected_errors(lines: list[dict[str, Any]], store: str) -> Counter[str]:
    """The counters the tier owes for the faults injected into ``store``."""
    owed: Counter[str] = Counter()
    for line in lines:
        if line["store"] != store:
            continue
        owed["injected"] += 1
        if line["raised"]:
            owed["store_errors"] += 1
        if line["method"].startswith("get") and line["fault"] != "latency":
            owed["load_errors"] += line["keys"]  # every value it should have returned
        if line["method"].startswith("put") and line["raised"]:
            owed["save_errors"] += line["keys"]
    return owed


# -- fixtures: the reference and one walk per tier ------------------------------------


@pytest.fixture(scope="module")
def reference(run_job: Run) -> dict[str, dict[str, Any]]:
    """Tokens and log-probabilities of every prompt, without any connector."""
    names = list(PROMPTS)
    step = results(run_job([generate(*PROMPTS.values(), logprobs=True)]))[0]
    return {
        name: {"tokens": step["tokens"][i], "logprobs": step["logprobs"][i]}
        for i, name in enumerate(names)
    }


def faulty_kv(store: dict[str, Any], control: Path) -> dict[str, Any]:
    """KVTransferConfig fields of a FaultyStoreConnector over ``store``."""
    kv = store_kv(store, faults=str(control))
    kv.update(
        kv_connector="FaultyStoreConnector",
        kv_connector_module_path="tests.integration.faulty_connector",
    )
    return kv


def tier_walk(run_job: Run, tier: str, store: dict[str, Any], folder: Path) -> Walk:
    return walk(run_job, faulty_kv(store, folder / "tier.json"), PHASES[tier], folder)


@pytest.fixture(scope="module")
def memory_walk(run_job: Run, tmp_path_factory: pytest.TempPathFactory) -> Walk:
    folder = tmp_path_factory.mktemp("faults-memory")
    return tier_walk(run_job, "memory", {"type": "memory", "capacity": "64MiB"}, folder)


@pytest.fixture(scope="module")
def disk_walk(run_job: Run, tmp_path_factory: pytest.TempPathFactory) -> Walk:
    folder = tmp_path_factory.mktemp("faults-disk")
    store = {"type": "disk", "path": str(folder / "entries"), "capacity": "256MiB"}
    return tier_walk(run_job, "disk", store, folder)


@pytest.fixture(scope="module")
def redis_walk(run_job: Run, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Walk:
    folder = tmp_path_factory.mktemp("faults-redis")
    prefix = f"kvmux-faults-{uuid.uuid4().hex}:"  # nothing another test stored
    store = {"type": "redis", "url": redis_server.url, "key_prefix": prefix}
    return tier_walk(run_job, "redis", store, folder)


@pytest.fixture(scope="module")
def mux_walk(run_job: Run, tmp_path_factory: pytest.TempPathFactory) -> Walk:
    folder = tmp_path_factory.mktemp("faults-mux")

    memory = {"type": "memory", "capacity": 5 * BLOCK_ENTRY, "name": "memory"}
    disk = {"type": "disk", "path": str(folder / "entries"), "capacity": "256MiB"}
    kv = {
        "kv_connector": "MuxConnector",
        "kv_connector_module_path": "kvmux.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "policy": "compose",
            "connectors": [
                faulty_kv(memory, folder / "memory.json"),
                faulty_kv(disk, folder / "disk.json"),
            ],
        },
    }
    return walk(run_job, kv, PHASES["mux"], folder)


KNOWN_BUGS: dict[tuple[str, str], str] = {}  # (tier, phase) -> why it fails, if it must
CELLS = [
    pytest.param(
        tier,
        phase,
        id=f"{tier}-{phase.name}",
        marks=[
            pytest.mark.xfail(
                strict=True, raises=AssertionError, reason=KNOWN_BUGS[tier, phase.name]
            )
        ]
        if (tier, phase.name) in KNOWN_BUGS
        else [],
    )
    for tier, phases in PHASES.items()
    for phase in phases
]


@pytest.fixture
def walk_of(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Walk]]:
    yield lambda tier: request.getfixturevalue(f"{tier}_walk")


# -- the matrix ------------------------------------------------------------------------


def assert_exact(out: dict[str, Any], want: dict[str, Any]) -> None:
    assert out["tokens"][0] == want["tokens"]
    worst = max(abs(a - b) for a, b in zip(out["logprobs"][0], want["logprobs"], strict=True))
    assert worst < LOGPROB_TOLERANCE


@pytest.mark.parametrize(("tier", "phase"), CELLS)
def test_fault_is_a_counted_miss(
    tier: str, phase: Phase, walk_of: Callable[[str], Walk], reference: dict[str, Any]
) -> None:
    """Exact outputs under the phase's faults, and every injected fault counted."""
    result = walk_of(tier)
    outs = result.outputs[phase.name]
    lines = result.injected[phase.name]
    shown = ("lookups", "hit_tokens", "loaded_blocks", "saved_blocks")
    print(
        f"\n{tier}/{phase.name}: cached {[o['num_cached_tokens'][0] for o in outs]}",
        {
            n: {k: int(v) for k, v in c.items() if (k.endswith("errors") or k in shown) and v}
            for n, c in result.delta[phase.name].items()
        },
        dict(Counter(f"{x['store']}:{x['fault']}:{x['method']}" for x in lines)),
    )
    for prompt, out in zip(phase.prompts, outs, strict=True):
        assert_exact(out, reference[prompt])
    for prompt, out, want in zip(phase.prompts, outs, phase.cached, strict=False):
        assert want is None or out["num_cached_tokens"] == [want], prompt
    assert bool(lines) == phase.faulty  # the fault was really hit, and only then
    delta = result.delta[phase.name]
    for name, counters in delta.items():
        owed = expected_errors(lines, name)
        assert counters["store_errors"] == owed["store_errors"], name
        assert counters["save_errors"] == owed["save_errors"], name
        if phase.exact_loads:
            assert counters["load_errors"] == owed["load_errors"], name
        else:
            assert counters["load_errors"] >= owed["load_errors"], name


@pytest.mark.parametrize("tier", list(PHASES))
def test_every_injected_fault_is_counted_overall(tier: str, walk_of: Callable[[str], Walk]) -> None:
    """Over the whole walk: counters match the record, and no child hook ever raised."""
    result = walk_of(tier)
    lines = [line for phase in result.phases for line in result.injected[phase.name]]
    for name, counters in result.run["stats"].items():
        owed = expected_errors(lines, name)
        assert counters["store_errors"] == owed["store_errors"], name
        assert counters["save_errors"] == owed["save_errors"], name
        assert counters["load_errors"] >= owed["load_errors"], name
    for label, counters in result.run["mux"].items():
        assert counters.get("errors", 0) == 0, label  # StoreErrors never escaped a child
    assert unexpected_tracebacks(result.run["log"]) == []


def test_mux_warm_up_loads_from_both_children(mux_walk: Walk) -> None:
    """The setup the mux phases rely on: LONG loads 5 blocks from memory and 5 from disk."""
    _, head, split = mux_walk.outputs["warm"]
    hits = {
        tier: split["stats"][tier]["hit_tokens"] - head["stats"][tier]["hit_tokens"]
        for tier in ("memory", "disk")
    }
    assert hits == {"memory": 5 * BLOCK, "disk": 5 * BLOCK}


def test_memory_tier_never_promises_blocks_it_failed_to_save(
    memory_walk: Walk, mux_walk: Walk
) -> None:
    """Q's saves failed (ENOSPC), R's too (StoreError): later they are a clean miss.

    The scheduler admits keys into its MirrorIndex when it plans their saves; the worker
    reports every save the store did not take back (``missing``), so the index never
    promises a block the store never got.
    """
    _, p, q, _, r = memory_walk.outputs["recovered"]
    errors = [out["stats"]["memory"]["load_errors"] for out in (p, q, r)]
    assert q["num_cached_tokens"] == [0] and r["num_cached_tokens"] == [0]
    assert errors[0] == errors[1] == errors[2]  # no load failed after the faults were off
    # under MuxConnector: HEAD's promotion to memory failed, then LONG was offered HEAD's
    # blocks from memory and failed to load them
    assert mux_walk.delta["memory-error-put"]["memory"]["load_errors"] == 0
