"""Saving-bar protocol on a full disk tier: through the page cache (spares reused) or
around it, alternating engine pairs (ABBA); each arm has its own filled directory."""

import json
import os
import sys
import threading
import time
from pathlib import Path

from kvmux.tools.bench import e2e
from kvmux.tools.bench.allocator import allocator_env
from kvmux.tools.bench.disk_fill import fill_disk
from kvmux.tools.bench.profiles import ENTRY_BYTES, FULL
from kvmux.tools.bench.redis_proc import RedisProcess
from kvmux.tools.bench.saving import _session, pair_costs
from kvmux.tools.models import build_random_llama

work = Path(os.environ.get("KVMUX_BENCH_WORKDIR", "bench-work"))
model = build_random_llama(work / "model-bench-bfloat16", FULL.model_size, FULL.dtype)
_, env = allocator_env("auto")
sessions, offset = int(sys.argv[1]), int(sys.argv[2])  # distinct prompts per series
low = {"mem_available_kib": 1 << 62}


def watch_memory() -> None:
    while True:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                low["mem_available_kib"] = min(low["mem_available_kib"], int(line.split()[1]))
        time.sleep(1)


threading.Thread(target=watch_memory, daemon=True).start()
rows: dict[bool, list] = {True: [], False: []}
with RedisProcess(work / "redis-ab") as redis:
    print("redis filler", redis.fill(ENTRY_BYTES), flush=True)
    runners = {}
    for direct in (True, False):
        runner = e2e.Runner(FULL, model, work / f"spare-ab-{direct}", redis.url, {}, env, direct)
        print("disk filler", direct, fill_disk(runner.disk_path, ENTRY_BYTES), flush=True)
        runners[direct] = runner
    for s in range(sessions):
        direct = (s % 4) in (0, 3)  # ABBA
        got = _session(runners[direct], "multi-process", 2, ("none", "kvmux-mux-redis"), offset + s)
        rows[direct] += got
        costs = pair_costs(got, "kvmux-mux-redis", "multi-process")
        print(s, direct, [round(c, 3) for c in costs], low, flush=True)
out = {str(k): v for k, v in rows.items()} | {"low": low}
json.dump(out, open(f"spare-ab-{offset}.json", "w"), indent=1)
for direct, r in rows.items():
    print(direct, sorted(round(c, 3) for c in pair_costs(r, "kvmux-mux-redis", "multi-process")))
