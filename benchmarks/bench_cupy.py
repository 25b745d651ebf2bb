"""``cupy.empty`` through mrkit's allocator beside CuPy's own default pool (and RMM's if present).

Run on a GPU: ``python benchmarks/bench_cupy.py``; prints us per empty+free and the ratios.
"""
from __future__ import annotations

import time

import cupy

import mrkit
import mrkit.cupy
from mrkit import DeviceMemoryResource, PoolResource


def bench(n, count=20000):
    empty, u8 = cupy.empty, cupy.uint8
    t0 = time.perf_counter()
    for _ in range(count):
        a = empty(n, dtype=u8)
        del a
    return (time.perf_counter() - t0) / count * 1e6


def main(rounds=4):
    rows = {}
    default = cupy.get_default_memory_pool().malloc
    configs = {"cupy default pool": default,
               "mrkit pool": mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))}
    try:
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
        # RMM's allocator serves RMM's current resource: make it RMM's pool, the fair peer
        rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource()))
        configs["rmm_cupy_allocator (rmm pool)"] = rmm_cupy_allocator
    except ImportError:
        pass
    # every allocator in turn, several rounds, best of each: the machine's slow phases hit all alike
    for _ in range(rounds):
        for name, fn in configs.items():
            cupy.cuda.set_allocator(fn)
            bench(256, 500)  # warm this allocator's caches
            r = rows.setdefault(name, {})
            for n in (256, 64 << 10, 8 << 20):
                r[n] = min(r.get(n, float("inf")), bench(n))
    cupy.cuda.set_allocator(default)
    print("| allocator | 256 B | 64 KiB | 8 MiB |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.2f} us" for v in r.values()) + " |")
    ref = rows["cupy default pool"]
    mine = rows["mrkit pool"]
    print("| **mrkit / cupy default** | " + " | ".join(f"{mine[k] / ref[k]:.2f}x" for k in ref) + " |")
    if "rmm_cupy_allocator (rmm pool)" in rows:
        r = rows["rmm_cupy_allocator (rmm pool)"]
        print("| **mrkit / rmm** | " + " | ".join(f"{mine[k] / r[k]:.2f}x" for k in ref) + " |")
    else:
        print("(rmm not installed: no rmm_cupy_allocator column)")


if __name__ == "__main__":
    main()
