"""Whether one ``cuMemUnmap`` over several adjacent whole mappings is accepted, and what it costs
against one call per mapping (microseconds), on this machine's GPU, through mrkit's driver layer.

    python tools/probe_unmap_batch.py

A footprint-limited VirtualMemoryResource moves free mappings one unmap call each; if the driver's
cost is per call rather than per page, adjacent mappings moved together could share one."""
from __future__ import annotations

import time

from mrkit.driver import get_driver

MiB = 1 << 20


def main() -> None:
    drv = get_driver()
    dev = 0
    drv.ensure_context(dev)
    gran = drv.mem_get_allocation_granularity(dev)
    base = drv.mem_address_reserve(32 << 30, gran)
    print("| mappings x size | one unmap per mapping, us (total) | one unmap for all, us | set access for all, us |")
    print("|---|---|---|---|")
    for size, k in ((2 * MiB, 8), (64 * MiB, 8), (256 * MiB, 8), (256 * MiB, 2)):
        hs = [drv.mem_create(dev, size) for _ in range(k)]

        def map_all():
            for i, h in enumerate(hs):
                drv.mem_map(base + i * size, size, 0, h)
            t0 = time.perf_counter()
            drv.mem_set_access(base, k * size, dev, "readwrite")
            return (time.perf_counter() - t0) * 1e6

        each, whole, access = [], [], []
        for _ in range(3):
            access.append(map_all())
            drv.touch(base, k * size, 0)
            drv.stream_synchronize(0)
            t0 = time.perf_counter()
            for i in range(k):
                drv.mem_unmap(base + i * size, size)
            each.append((time.perf_counter() - t0) * 1e6)
            access.append(map_all())
            drv.touch(base, k * size, 0)
            drv.stream_synchronize(0)
            t0 = time.perf_counter()
            try:
                drv.mem_unmap(base, k * size)
            except Exception as exc:  # the driver refuses a range over several mappings
                print(f"| {k} x {size // MiB} MiB | {min(each):.0f} | refused: {exc} | |")
                for i in range(k):
                    drv.mem_unmap(base + i * size, size)
                whole = None
                break
            whole.append((time.perf_counter() - t0) * 1e6)
        if whole is not None:
            print(f"| {k} x {size // MiB} MiB | {min(each):.0f} ({min(each) / k:.1f} a mapping) | "
                  f"{min(whole):.0f} | {min(access):.0f} |")
        for h in hs:
            drv.mem_release(h)
    drv.mem_address_free(base, 32 << 30)


if __name__ == "__main__":
    main()
