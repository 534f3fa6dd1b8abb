"""Saving-bar protocol, disk tier around / through the page cache, alternating sessions."""
import json, os, sys
from pathlib import Path
from kvmux.tools.bench import e2e
from kvmux.tools.bench.saving import _session, pair_costs
from kvmux.tools.bench.profiles import FULL, ENTRY_BYTES
from kvmux.tools.bench.allocator import allocator_env
from kvmux.tools.bench.redis_proc import RedisProcess
from kvmux.tools.models import build_random_llama
work = Path(os.environ.get("KVMUX_BENCH_WORKDIR", "bench-work"))
model = build_random_llama(work / "model-bench-bfloat16", FULL.model_size, FULL.dtype)
_, env = allocator_env("auto")
sessions, OFFSET = int(sys.argv[1]), int(sys.argv[2])  # 10, then 20: distinct prompts
rows = {True: [], False: []}
with RedisProcess(work / "redis-ab") as redis:
    print("filler", redis.fill(ENTRY_BYTES), flush=True)
    for s in range(sessions):
        direct = (s % 4) in (0, 3)  # ABBA
        runner = e2e.Runner(FULL, model, work / "saving-ab", redis.url, {}, env, direct)
        got = _session(runner, "multi-process", 2, ("none", "kvmux-mux-redis"), OFFSET + s)
        rows[direct] += got
        print(s, direct, [round(c, 3) for c in pair_costs(got, "kvmux-mux-redis", "multi-process")], flush=True)
json.dump({str(k): v for k, v in rows.items()}, open(f"saving-ab-{OFFSET // 10}.json", "w"), indent=1)
for direct, r in rows.items():
    print(direct, [round(c, 3) for c in pair_costs(r, "kvmux-mux-redis", "multi-process")])
