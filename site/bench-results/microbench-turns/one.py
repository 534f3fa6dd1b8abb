"""One memory-tier microbenchmark (whichever microbench.py is on PYTHONPATH): put and get ratios."""
import json, warnings
from kvmux.tools.bench import microbench as mb
b = mb._Bench(128, 2 * 1024 * 1024, False)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    rows = mb._memory(b)
print(json.dumps([{k: r[k] for k in ("op", "ratio", "kvmux_gbps", "limit_gbps")} for r in rows]))
