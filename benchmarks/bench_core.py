"""The compiled-core targets in one run: what users call, beside CuPy (and PyTorch, RMM where present).

* ``cupy.empty`` pairs (256 B, 64 KiB, 8 MiB) and a batch of 1000 log-uniform sizes, through
  ``mrkit.cupy`` over a pool, beside CuPy's own default pool (``cupy.empty`` with CuPy's allocator);
* the pool's own pair (``allocate``+``deallocate``) beside CuPy's ``MemoryPool.malloc`` pair;
* the batch through the VMM beside CuPy's pool batch;
* RMM's random workload (sizes to 8 MiB) beside CuPy's ``MemoryPool``: new sizes every pass, each pass
  timed on its first run; and replayed (each pass's sizes run once untimed, then again, timed).

Every allocator is measured in turn, several rounds, best of each, in one process. The build in use
(compiled or Python, ``MRKIT_NO_EXTENSIONS=1``) is printed; run once per build:

    python benchmarks/bench_core.py --json core.json
    MRKIT_NO_EXTENSIONS=1 python benchmarks/bench_core.py --json python.json
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pool as bp  # noqa: E402

import mrkit  # noqa: E402
import mrkit.cupy  # noqa: E402
from mrkit import DeviceMemoryResource, PoolResource, Stream  # noqa: E402
from mrkit._engine import core_description  # noqa: E402


def empty_pairs(n: int, count: int) -> float:
    import cupy
    empty, u8 = cupy.empty, cupy.uint8
    t0 = time.perf_counter()
    for _ in range(count):
        a = empty(n, dtype=u8)
        del a
    return (time.perf_counter() - t0) / count * 1e6


def empty_batch(sizes, order, reps: int) -> float:
    import cupy
    empty, u8 = cupy.empty, cupy.uint8
    t0 = time.perf_counter()
    for _ in range(reps):
        arrs = [empty(n, dtype=u8) for n in sizes]
        for i in order:
            arrs[i] = None
    return (time.perf_counter() - t0) / (reps * len(sizes)) * 1e6


def random_rows(peers: dict, ops: int, passes: int) -> dict:
    """RMM's random workload, best of ``passes`` passes per allocator, the allocators taking turns
    pass by pass (the host's speed drifts): ``"random (fresh sizes)"``, new sizes every pass, each
    pass timed on its first run (a first pass warms up, not counted); ``"random (replayed)"``, each
    pass's sizes run twice, the second run timed."""
    rows = {name: {"random (fresh sizes)": math.inf, "random (replayed)": math.inf} for name in peers}
    for k in range(passes + 1):
        for name, p in peers.items():
            fresh = bp.random_workload(p, ops, seed=100 + k, replay=False)
            replayed = bp.random_workload(p, ops, seed=1000 + k, replay=True)
            if k:
                r = rows[name]
                r["random (fresh sizes)"] = min(r["random (fresh sizes)"], fresh)
                r["random (replayed)"] = min(r["random (replayed)"], replayed)
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import cupy
    count = 3000 if args.quick else 20000
    rng = random.Random(0)
    sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]
    order = list(range(1000))
    rng.shuffle(order)
    reps = 2 if args.quick else 8
    res: dict = {"core": core_description(), "cupy": cupy.__version__}
    print("core:", res["core"], flush=True)

    # cupy.empty: CuPy's default pool vs mrkit's allocator over a pool, switched in turn
    cupy_default = cupy.get_default_memory_pool().malloc
    mine = mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))
    allocs = {"cupy": cupy_default, "mrkit": mine}
    empty = {name: {} for name in allocs}
    for fn in allocs.values():  # warm, untimed: a loop's sizes are hot in mrkit's pool from its fourth pass
        cupy.cuda.set_allocator(fn)
        empty_batch(sizes, order, 4)
    for _ in range(args.rounds):
        for name, fn in allocs.items():
            cupy.cuda.set_allocator(fn)
            for n in (256, 64 << 10, 8 << 20):
                k = f"empty pair {n}"
                empty[name][k] = min(empty[name].get(k, math.inf), empty_pairs(n, count))
            empty[name]["empty batch"] = min(empty[name].get("empty batch", math.inf), empty_batch(sizes, order, reps))
    cupy.cuda.set_allocator(cupy_default)
    res["empty"] = empty

    # the allocators' own calls
    streams = [Stream.create(0) for _ in range(8)]
    peers = {"mrkit pool": bp.mrkit_peer("pool", streams), "mrkit vmm": bp.mrkit_peer("vmm", streams),
             "cupy MemoryPool": bp.cupy_peer("MemoryPool", streams)}
    try:
        import torch
        if torch.cuda.is_available():
            peers["torch caching"] = bp.torch_peer(streams)
    except ImportError:
        pass
    try:
        import rmm  # noqa: F401
        peers["rmm pool"] = bp.rmm_peer("pool", streams)
    except ImportError:
        pass
    calls = {name: {} for name in peers}
    for _ in range(args.rounds):
        for name, p in peers.items():
            r = calls[name]
            for n in (256, 64 << 10, 8 << 20):
                r[f"pair {n}"] = min(r.get(f"pair {n}", math.inf), bp.pairs(p, n, count if n < (8 << 20) else count // 4))
            r["batch"] = min(r.get("batch", math.inf), bp.batch(p, sizes, order, reps))
    for name, r in random_rows(peers, *((2000, 6) if args.quick else (10000, 6))).items():
        calls[name].update(r)
    res["calls"] = calls
    for s in streams:
        s.synchronize()

    e, c = empty, calls
    ratios = {
        **{f"cupy.empty {k[6:]}": e["mrkit"][k] / e["cupy"][k] for k in e["mrkit"]},
        **{f"pool {k} / cupy MemoryPool": c["mrkit pool"][k] / c["cupy MemoryPool"][k]
           for k in ("pair 256", "pair 65536", "pair 8388608", "batch", "random (fresh sizes)", "random (replayed)")},
        "vmm batch / cupy MemoryPool batch": c["mrkit vmm"]["batch"] / c["cupy MemoryPool"]["batch"],
    }
    res["ratios"] = ratios
    print(json.dumps({"empty": e, "calls": c}, indent=1))
    for k, v in ratios.items():
        print(f"{k:45s} {v:6.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
