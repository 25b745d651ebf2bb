"""Where the time of cupy.empty through mrkit goes (GPU): floors of CuPy's allocator hooks, mrkit's path,
a profile. Diagnostic, not a benchmark of record."""
import cProfile
import io
import pstats
import time

import cupy

import mrkit
import mrkit.cupy
from mrkit import DeviceMemoryResource, PoolResource, StatisticsAdaptor


def loop(n, count=20000):
    empty, u8 = cupy.empty, cupy.uint8
    for _ in range(count):
        empty(n, dtype=u8)


def best(fn, reps=5, count=20000):
    b = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(count)
        b = min(b, (time.perf_counter() - t0) / count)
    return b * 1e6


def with_alloc(alloc, n=256):
    cupy.cuda.set_allocator(alloc)
    loop(n, 1000)
    r = best(lambda c: loop(n, c))
    return r


default = cupy.get_default_memory_pool().malloc
base = cupy.cuda.alloc(1 << 20)
bp = base.ptr
pool = PoolResource(DeviceMemoryResource(0))
rows = {}
rows["cupy default"] = with_alloc(default)
rows["PFA trivial"] = with_alloc(cupy.cuda.PythonFunctionAllocator(lambda n, d: bp, lambda p, d: None).malloc)
U, MP = cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer
rows["Unowned trivial"] = with_alloc(lambda n: MP(U(bp, n, None, 0), 0))
rows["mrkit pool (PFA)"] = with_alloc(mrkit.cupy.allocator(pool))
rows["cupy default again"] = with_alloc(default)
gs = cupy.cuda.get_current_stream
rows["get_current_stream x1"] = best(lambda c: [gs() for _ in range(c)])
s = mrkit.DEFAULT_STREAM
a, f = pool.allocate, pool.deallocate
def pairs(c):
    for _ in range(c):
        f(a(256, s), 256, s)
rows["mrkit pool pair (no cupy)"] = best(pairs)
st = StatisticsAdaptor(pool)
a2, f2 = st.allocate, st.deallocate
def pairs2(c):
    for _ in range(c):
        f2(a2(256, s), 256, s)
for i in range(3):
    rows[f"pool pair #{i}"] = best(pairs)
    rows[f"stats pair #{i}"] = best(pairs2)
for k, v in rows.items():
    print(f"{k:32s} {v:.3f} us")
cupy.cuda.set_allocator(mrkit.cupy.allocator(pool))
pr = cProfile.Profile()
pr.enable()
loop(256, 20000)
pr.disable()
out = io.StringIO()
pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(12)
print(out.getvalue())
cupy.cuda.set_allocator(default)
