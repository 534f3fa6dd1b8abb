"""Restart hits at 4K tokens, several per engine: ExampleConnector, kvmux disk async, kvmux disk sync."""
import json, statistics, sys
from pathlib import Path
from kvmux.tools.bench import e2e
from kvmux.tools.bench.allocator import allocator_env
from kvmux.tools.bench.configs import kv_config as base_kv
from kvmux.tools.bench.profiles import FULL

def kv(name, work, redis_url, direct_writes=False, disk_path=None):
    if name == "kvmux-sync":
        cfg = base_kv("kvmux-mux-first", work, redis_url, direct_writes, disk_path)
        cfg["kv_connector_extra_config"]["tiers"][1]["async_loads"] = "never"
        return cfg
    if name == "kvmux-async":
        return base_kv("kvmux-mux-first", work, redis_url, direct_writes, disk_path)
    return base_kv(name, work, redis_url, direct_writes, disk_path)
e2e.kv_config = kv
import os
_, env = allocator_env(os.environ.get("ALLOC", "auto"))
runner = e2e.Runner(FULL, Path("/tmp/s24/bw/model-bench-bfloat16"), Path("/tmp/s34/rs/work"), None, {}, env)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
settle = {"op": "sleep", "seconds": 1.0}
out = {}
for k, config in enumerate(os.environ.get("CONFIGS", "example,kvmux-async,kvmux-sync").split(",")):
    prompts = [runner.tokens(5000 + 100 * k + i, 4096) for i in range(N)]
    cold = e2e._generates(runner.run(config, [s for p in prompts for s in (e2e._gen([p]), settle)]))
    again = e2e._generates(runner.run(config, [s for p in prompts for s in (settle, e2e._gen([p]))], fresh=False))
    hits = [g["seconds"] for g in again[1:]]
    colds = [g["seconds"] for g in cold[1:]]
    cached = [g["num_cached_tokens"][0] for g in again[1:]]
    out[config] = {"restart_s": hits, "cold_s": colds, "cached": cached}
    print(config, "restart", [round(h, 4) for h in hits], "median", round(statistics.median(hits), 4),
          "cold median", round(statistics.median(colds), 3), "cached", cached, flush=True)
Path(os.environ.get("OUT", "/tmp/s34/rs/out.json")).write_text(json.dumps(out, indent=1))
