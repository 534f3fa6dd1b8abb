"""Where a 31-block disk load's time goes (page cache warm): read, verify, copy in."""
import statistics, time, warnings
from pathlib import Path
import torch
from kvmux import codec
from kvmux.stores.disk import DiskStore
from kvmux.tools.bench import microbench as mb
warnings.simplefilter("ignore")
N = 31
b = mb._Bench(N, 2 * 1024 * 1024, False)
root = Path("/tmp/s34/rs/phdisk"); import shutil; shutil.rmtree(root, ignore_errors=True)
store = DiskStore(root, capacity=4 * N * (b.entry_bytes + 4096))
for i in range(N):
    store.put_many_parts([(b.keys[i], b.encode_parts(i))])
res = {"read": [], "verify": [], "copy": [], "read_into": [], "file_read": []}
buf = bytearray(len(b.values[0]) + 1)
for r in range(7):
    t0 = time.perf_counter(); datas = [store.get(k) for k in b.keys]; t1 = time.perf_counter()
    dec = [codec.decode(d, mb.NAMESPACE, b.keys[i]) for i, d in enumerate(datas)]; t2 = time.perf_counter()
    for i, e in enumerate(dec): b.mover.copy_in(i, e)
    t3 = time.perf_counter()
    res["read"].append(t1 - t0); res["verify"].append(t2 - t1); res["copy"].append(t3 - t2)
    paths = sorted(p for p in root.rglob("*") if p.is_file())[:N]
    t4 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f: f.readinto(buf)
    t5 = time.perf_counter()
    for p in paths: p.read_bytes()
    t6 = time.perf_counter()
    res["read_into"].append(t5 - t4); res["file_read"].append(t6 - t5)
for k, v in res.items():
    print(f"{k:10s} median {1e3*statistics.median(v):6.2f} ms  all {[round(1e3*x,1) for x in v]}")
