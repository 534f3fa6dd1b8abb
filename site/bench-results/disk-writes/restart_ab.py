import json, sys
import os
from pathlib import Path
from kvmux.tools.bench import e2e
from kvmux.tools.bench.profiles import FULL
from kvmux.tools.bench.allocator import allocator_env
from kvmux.tools.models import build_random_llama
work = Path(os.environ.get("KVMUX_BENCH_WORKDIR", "bench-work"))
model = build_random_llama(work / "model-bench-bfloat16", FULL.model_size, FULL.dtype)
_, env = allocator_env("auto")
out = []
for rnd in range(int(sys.argv[1])):
    for direct in ((True, False) if rnd % 2 == 0 else (False, True)):
        runner = e2e.Runner(FULL, model, work / "restart", None, {}, env, direct)
        for r in e2e.long_prompts(runner, "kvmux-mux-first"):
            r["direct"] = direct; out.append(r)
            print(direct, r.get("prompt_tokens"), round(r["ttft_cold_s"], 3), round(r["ttft_warm_s"], 3), round(r["ttft_restart_s"], 3), round(r["ttft_restart_s"] / r["ttft_cold_s"], 3), flush=True)
json.dump(out, open("restart.json", "w"), indent=1)
