import os, time
exec(open("recycle_probe.py").read().split("print(")[0])
r0 = int(open("/sys/devices/virtio0/features").read().strip()[5]) if os.path.exists("/sys/devices/virtio0/features") else None
print("big fill", new_files("z", 2000))
for i in range(2000): os.unlink(f"{root}/z{i}")
time.sleep(8)
print("new after free+report", new_files("a", N))
os.sync(); time.sleep(3)
print("recycle a->b", recycle("b", "a", N))
os.sync(); time.sleep(3)
print("churn b->c", churn("c", "b", N))
for f in os.listdir(root): os.unlink(f"{root}/{f}")
