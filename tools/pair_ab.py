"""Pool pair A/B: the allocate + deallocate pair of mrkit's pool (256 B / 64 KiB / 8 MiB) and CuPy's
MemoryPool.malloc pair, in rounds, for whichever mrkit PYTHONPATH points at. Prints one JSON line."""
import json
import sys
import time

import cupy
import mrkit
from mrkit import DeviceMemoryResource, PoolResource


def pair(fn, count=20000):
    t = time.perf_counter()
    fn(count)
    return (time.perf_counter() - t) / count * 1e6


pool = PoolResource(DeviceMemoryResource(0))
s = mrkit.DEFAULT_STREAM
cp = cupy.cuda.MemoryPool()
out = {"mrkit": mrkit.__file__, "core": mrkit._engine.core_name()}
for n in (256, 65536, 8 << 20):
    def ours(count, a=pool.allocate, f=pool.deallocate, n=n):
        for _ in range(count):
            f(a(n, s), n, s)

    def theirs(count, m=cp.malloc, n=n):
        for _ in range(count):
            m(n)
    ours(2000), theirs(2000)
    o, t = min(pair(ours) for _ in range(5)), min(pair(theirs) for _ in range(5))
    out[f"pair {n}"] = [round(o, 3), round(t, 3), round(o / t, 3)]
print(json.dumps(out))
sys.stdout.flush()
