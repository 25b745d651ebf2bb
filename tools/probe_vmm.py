"""Cost of each VMM driver step on this machine, through mrkit's driver layer (microseconds).

Run on a GPU: ``python tools/probe_vmm.py``. Informs VirtualMemoryResource's policy: what a warm
operation can afford to do with the driver."""
from __future__ import annotations

import statistics
import time

from mrkit.driver import get_driver

MiB = 1 << 20


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts), min(ts)


def main():
    drv = get_driver()
    dev = 0
    drv.ensure_context(dev)
    gran = drv.mem_get_allocation_granularity(dev)
    base = drv.mem_address_reserve(64 << 30, gran)
    print(f"granularity {gran}")
    print("| step | size | median us | min us |\n|---|---|---|---|")
    for size in (2 * MiB, 8 * MiB, 32 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB):
        reps = 20 if size <= 64 * MiB else 6
        handles = []
        t_create = []
        for _ in range(reps):
            t0 = time.perf_counter()
            handles.append(drv.mem_create(dev, size))
            t_create.append((time.perf_counter() - t0) * 1e6)
        rows = {"cuMemCreate": t_create, "cuMemMap": [], "cuMemSetAccess": [], "cuMemUnmap": [],
                "remap (unmap+map+setaccess)": [], "cuMemRelease": []}
        vas = [base + i * size for i in range(reps)]
        for va, h in zip(vas, handles):
            t0 = time.perf_counter(); drv.mem_map(va, size, 0, h); t1 = time.perf_counter()
            drv.mem_set_access(va, size, dev, "readwrite"); t2 = time.perf_counter()
            rows["cuMemMap"].append((t1 - t0) * 1e6)
            rows["cuMemSetAccess"].append((t2 - t1) * 1e6)
        drv.touch(vas[0], size, 0)
        drv.stream_synchronize(0)
        off = 32 << 30
        for va, h in zip(vas, handles):
            t0 = time.perf_counter()
            drv.mem_unmap(va, size)
            t1 = time.perf_counter()
            drv.mem_map(va + off, size, 0, h)
            drv.mem_set_access(va + off, size, dev, "readwrite")
            t2 = time.perf_counter()
            rows["cuMemUnmap"].append((t1 - t0) * 1e6)
            rows["remap (unmap+map+setaccess)"].append((t2 - t0) * 1e6)
        for va, h in zip(vas, handles):
            drv.mem_unmap(va + off, size)
            t0 = time.perf_counter(); drv.mem_release(h)
            rows["cuMemRelease"].append((time.perf_counter() - t0) * 1e6)
        for k, v in rows.items():
            print(f"| {k} | {size // MiB} MiB | {statistics.median(v):.1f} | {min(v):.1f} |")
    # one cuMemSetAccess over many adjacent mappings
    n = 32
    hs = [drv.mem_create(dev, 2 * MiB) for _ in range(n)]
    for i, h in enumerate(hs):
        drv.mem_map(base + i * 2 * MiB, 2 * MiB, 0, h)
    t0 = time.perf_counter(); drv.mem_set_access(base, n * 2 * MiB, dev, "readwrite")
    print(f"| cuMemSetAccess over {n} adjacent 2 MiB mappings | {n * 2} MiB | {(time.perf_counter() - t0) * 1e6:.1f} | |")
    for i, h in enumerate(hs):
        drv.mem_unmap(base + i * 2 * MiB, 2 * MiB); drv.mem_release(h)
    drv.mem_address_free(base, 64 << 30)
    print("| stream_synchronize (idle default stream) | | %.1f | %.1f |" % timed(lambda: drv.stream_synchronize(0), 200))
    ev = drv.event_create(dev)
    print("| event_record + event_query | | %.1f | %.1f |" % timed(lambda: (drv.event_record(ev, 0), drv.event_query(ev)), 200))
    print("| ctx_synchronize | | %.1f | %.1f |" % timed(lambda: drv.ctx_synchronize(dev), 200))


if __name__ == "__main__":
    main()
