import os, sys, time, secrets
root = "/tmp/s32/probe"; os.makedirs(root, exist_ok=True)
N = 400; SIZE = 2 * 2**20
data = os.urandom(SIZE)
def cpu(): return time.thread_time()
def new_files(tag, n):
    t = cpu(); w = time.perf_counter()
    for i in range(n):
        p = f"{root}/{tag}{i}"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data); os.close(fd)
    return (cpu() - t) / n * 1e3, (time.perf_counter() - w) / n * 1e3
def churn(tag, old, n):  # new file, unlink an old one
    t = cpu(); w = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{root}/{tag}{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data); os.close(fd); os.unlink(f"{root}/{old}{i}")
    return (cpu() - t) / n * 1e3, (time.perf_counter() - w) / n * 1e3
def recycle(tag, old, n):  # rename the old file, overwrite in place
    t = cpu(); w = time.perf_counter()
    for i in range(n):
        os.rename(f"{root}/{old}{i}", f"{root}/{tag}{i}")
        fd = os.open(f"{root}/{tag}{i}", os.O_WRONLY)
        os.write(fd, data); os.close(fd)
    return (cpu() - t) / n * 1e3, (time.perf_counter() - w) / n * 1e3
print("first fill (new)", new_files("a", N))
print("churn a->b", churn("b", "a", N))
os.sync(); time.sleep(5)
print("churn b->c", churn("c", "b", N))
os.sync(); time.sleep(5)
print("recycle c->d", recycle("d", "c", N))
os.sync(); time.sleep(5)
print("recycle d->e", recycle("e", "d", N))
os.sync(); time.sleep(5)
print("churn e->f", churn("f", "e", N))
for f in os.listdir(root): os.unlink(f"{root}/{f}")
