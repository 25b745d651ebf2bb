"""How the pool's growth policy changes its speed and footprint on bench_core.py's random workload
(RMM's rules to 8 MiB, new sizes each pass): PoolResource(DeviceMemoryResource) with growth_factor
0 (the default: each chunk the size needed), 0.25, 0.5 and 1.0, the VMM and CuPy's MemoryPool, taking
turns pass by pass, best of the passes; the footprint is what each holds at the end, and the pool's
chunks and free blocks show the fragmentation that chunk boundaries leave.

    PYTHONPATH=$PWD python3 tools/probe_pool_growth.py [--ops 10000] [--passes 6]
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os

_spec = importlib.util.spec_from_file_location(
    "bench_pool", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "bench_pool.py"))
bp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bp)

from mrkit import DeviceMemoryResource, PoolResource, Stream, VirtualMemoryResource  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--passes", type=int, default=6)
    args = ap.parse_args(argv)
    streams = [Stream.create(0) for _ in range(8)]
    peers, pools = {}, {}
    for gf in (0.0, 0.25, 0.5, 1.0):
        pool = PoolResource(DeviceMemoryResource(0), growth_factor=gf)
        pools[f"pool gf={gf}"] = pool
        peers[f"pool gf={gf}"] = bp._explicit_stream_peer(pool.allocate, pool.deallocate, streams, streams,
                                                           lambda p=pool: p.pool_size)
    vmm = VirtualMemoryResource(0)
    peers["vmm"] = bp._explicit_stream_peer(vmm.allocate, vmm.deallocate, streams, streams, lambda: vmm.mapped_bytes)
    try:
        peers["cupy MemoryPool"] = bp.cupy_peer("MemoryPool", streams)
    except ImportError:  # without CuPy (MRKIT_BACKEND=sim on a machine without a GPU): mrkit's rows only
        pass
    best = {name: math.inf for name in peers}
    for k in range(args.passes + 1):
        for name, p in peers.items():
            us = bp.random_workload(p, args.ops, seed=100 + k, replay=False)
            if k:
                best[name] = min(best[name], us)
    ref = best.get("cupy MemoryPool", math.nan)
    for name, p in peers.items():
        extra = ""
        if name in pools:
            arena = pools[name].arena
            st = arena.states.get(streams[0].uid)
            extra = f"  free blocks {len(list(st.free.items())) if st else 0}"
        print(f"{name:18s} {best[name]:.3f} us/op  {best[name] / ref:.2f}x cupy  footprint {p[2]() / 2**20:.0f} MiB{extra}")


if __name__ == "__main__":
    main()
