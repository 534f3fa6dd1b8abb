import os, statistics, time, warnings
from pathlib import Path
from kvmux.stores.disk import DiskStore, _read_at_most
from kvmux.tools.bench import microbench as mb
warnings.simplefilter("ignore")
N = 31
b = mb._Bench(N, 2 * 1024 * 1024, False)
root = Path("/tmp/s34/rs/phdisk2"); import shutil; shutil.rmtree(root, ignore_errors=True)
store = DiskStore(root, capacity=4 * N * (b.entry_bytes + 4096))
for i in range(N):
    store.put_many_parts([(b.keys[i], b.encode_parts(i))])
paths = [store._path(k) for k in b.keys]
def touch_get(): [store.get(k) for k in b.keys]
def notouch_get():
    store.touch = False; [store.get(k) for k in b.keys]; store.touch = True
def raw_read():
    for p in paths:
        fd = os.open(p, os.O_RDONLY); os.read(fd, os.fstat(fd).st_size + 1); os.close(fd)
def raw_read_exact():
    for p in paths:
        fd = os.open(p, os.O_RDONLY); os.read(fd, os.fstat(fd).st_size); os.close(fd)
def read_bytes(): [p.read_bytes() for p in paths]
fns = [touch_get, notouch_get, raw_read, raw_read_exact, read_bytes]
res = {f.__name__: [] for f in fns}
for r in range(9):
    for f in (fns if r % 2 else fns[::-1]):
        t = time.perf_counter(); f(); res[f.__name__].append(time.perf_counter() - t)
for k, v in res.items():
    print(f"{k:15s} median {1e3*statistics.median(v):6.2f} ms  {[round(1e3*x,1) for x in v]}")
