"""Per-hook added µs/step, Mux vs Multi, in engines (as the bench's overhead phase)."""
import json, os, statistics, sys
from pathlib import Path
from kvmux.tools.bench import e2e
from kvmux.tools.bench.profiles import FULL
from kvmux.tools.bench.allocator import allocator_env
from kvmux.tools.models import build_random_llama
from kvmux.tools.engine import run_engine_job

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
children = int(sys.argv[2]) if len(sys.argv) > 2 else 1
work = Path(os.environ.get("KVMUX_BENCH_WORKDIR", "bench-work"))
model = build_random_llama(work / "model-bench-bfloat16", FULL.model_size, FULL.dtype)
_, env = allocator_env("auto")
runner = e2e.Runner(FULL, model, work, None, {}, env)
raw = {"mux": [], "multi": []}
orig = run_engine_job
def capture(job, env=None, **kw):
    out = orig(job, env=env, **kw)
    capture.last = out
    return out
e2e.run_engine_job = capture
for r in range(rounds):
    for kind in (("mux", "multi") if r % 2 == 0 else ("multi", "mux")):
        e2e._overhead_samples(runner, kind, children)
        for step in capture.last["steps"]:
            if step["op"] == "hook_times":
                raw[kind].append(step["seconds"])
        print(kind, "done", flush=True)
json.dump(raw, open(f"ovh-{children}.json", "w"))
def per_hook(samples):
    out = {}
    for s in samples:
        steps = s.get("scheduler/top/build_connector_meta/calls", 1)
        hooks = {k.split("/")[2] for k in s if k.count("/") == 2 and not k.endswith("calls")}
        for side in ("scheduler", "worker"):
            for h in hooks:
                top = s.get(f"{side}/top/{h}", 0.0); ch = s.get(f"{side}/children/{h}", 0.0)
                if f"{side}/top/{h}" in s:
                    out.setdefault((side, h), []).append(1e6 * (top - ch) / steps)
            out.setdefault((side, "TOTAL"), []).append(1e6 * (s.get(f"{side}/top", 0) - s.get(f"{side}/children", 0)) / steps)
    return {k: statistics.median(v) for k, v in out.items()}
m, u = per_hook(raw["mux"]), per_hook(raw["multi"])
for k in sorted(set(m) | set(u)):
    a, b = m.get(k, 0.0), u.get(k, 0.0)
    print(f"{k[0]:9s} {k[1]:40s} mux {a:7.2f} multi {b:7.2f} diff {a-b:+6.2f}")
