"""System CPU spent per 256 MiB of entries written: page cache (spares) vs direct vs fdatasync."""
import os, sys, time, hashlib
sys.path.insert(0, "/work/main/src")
from kvmux.stores import DiskStore
from kvmux.stores import disk as dm

def cpu_total():
    f = open("/proc/stat").readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, f[:8])
    return {"busy": user + nice + system + irq + softirq, "sys": system + irq + softirq, "steal": steal, "iowait": iowait}

def thread_stats():
    # kworker and flush threads' cpu
    tot = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            st = open(f"/proc/{pid}/stat").read()
        except OSError: continue
        name = st[st.index("(")+1:st.rindex(")")]
        if name.startswith("kworker") or name.startswith("jbd2") or name.startswith("flush"):
            f = st[st.rindex(")")+2:].split()
            tot += int(f[11]) + int(f[12])
    return tot

mode = sys.argv[1]
root = f"/tmp/s32/wb-{mode}"
cap = 2 * 2**30
store = DiskStore(root, cap, direct_writes=(mode == "direct"))
val = os.urandom(2 * 2**20)
i = 0
while store.used_bytes() + len(val) <= cap:
    store.put(hashlib.blake2b(b"f%d" % i).digest(), val); i += 1
os.sync(); time.sleep(3)
if mode == "fdatasync":
    real = dm._write_all
    def synced(fd, parts):
        real(fd, parts); os.fdatasync(fd)
    dm._write_all = synced
for rep in range(3):
    c0, k0, t0, w0 = cpu_total(), thread_stats(), time.thread_time(), time.time()
    for j in range(128):
        store.put(hashlib.blake2b(b"r%d-%d" % (rep, j)).digest(), val)
    t1, w1 = time.thread_time(), time.time()
    time.sleep(8)  # writeback happens
    c1, k1 = cpu_total(), thread_stats()
    print(mode, rep, "writer cpu %.3f s wall %.3f s" % (t1 - t0, w1 - w0),
          "system busy %.2f s (sys %.2f) kworker %.2f s steal %.2f" % ((c1["busy"]-c0["busy"])/100, (c1["sys"]-c0["sys"])/100, (k1-k0)/100, (c1["steal"]-c0["steal"])/100),
          "spares", len(os.listdir(root + "/spare")), flush=True)
