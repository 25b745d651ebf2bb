"""Allocation speed and footprint: mrkit's pool beside CuPy, PyTorch and RMM, in one run.

Measures (all from Python, warm, one process, one GPU):

* pairs     — alloc+free pairs of 256 B, 64 KiB and 8 MiB on one stream (us per pair);
* batch     — 1000 log-uniform sizes (256 B .. 4 MiB) allocated, then freed in random order (us per pair);
* random    — RMM's random-allocation workload: 10000 ops, 50/50 alloc/free, sizes uniform to 8 MiB;
* streams   — 8 streams, 8000 ops, one free in four on another stream ordered after the owner;
              reports us per op and the peak footprint each allocator held;
* adaptors  — the overhead of StatisticsAdaptor and LoggingAdaptor over the pool (ns per pair).

Run: ``python benchmarks/bench_pool.py [--quick] [--json out.json]`` (GPU); RMM is measured if importable.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
import time

from mrkit import DeviceMemoryResource, LoggingAdaptor, PoolResource, StatisticsAdaptor, Stream


def _timeit(fn, repeat=3):
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


# -- allocator adapters: each returns (alloc(n, si) -> handle, free(handle, si, owner), footprint(),
#    pair_loop(n, count), batch_loop(sizes, order), random_loop(plan)) ------------------------------------
def _random_loop_explicit(a, f, s):
    """RMM's random workload on stream ``s`` through ``a(n, s) -> ptr`` / ``f(ptr, n, s)``, as a user of an
    explicit-stream allocator writes it: the size kept beside the pointer."""
    def random_loop(plan):
        live = []
        for is_alloc, n, r in plan:
            if is_alloc or not live:
                live.append((a(n, s), n))
            else:
                p, m = live.pop(int(r * len(live)))
                f(p, m, s)
        for p, m in live:
            f(p, m, s)
    return random_loop



def _explicit_stream_peer(a, f, args, streams, footprint):
    """An allocator whose calls take the stream (mrkit, RMM): ``args[i]`` is its form of ``streams[i]``."""
    def alloc(n, si):
        return (a(n, args[si]), n)

    def free(h, si, owner=None):
        if owner is not None and owner != si:
            streams[si].wait(streams[owner])
        f(h[0], h[1], args[si])

    def pair_loop(n, count, s=args[0]):
        for _ in range(count):
            f(a(n, s), n, s)

    def batch_loop(sizes, order, s=args[0]):
        ptrs = [a(n, s) for n in sizes]
        for i in order:
            f(ptrs[i], sizes[i], s)
    return alloc, free, footprint, pair_loop, batch_loop, _random_loop_explicit(a, f, args[0])


def mrkit_peer(kind, streams):
    base = DeviceMemoryResource(0)
    if kind == "vmm":
        from mrkit import VirtualMemoryResource
        vmm = VirtualMemoryResource(0)
        return _explicit_stream_peer(vmm.allocate, vmm.deallocate, streams, streams, lambda: vmm.mapped_bytes)
    pool = PoolResource(base)
    mr = {"pool": pool, "stats": StatisticsAdaptor(pool), "log": LoggingAdaptor(pool, io.StringIO()),
          "driver-pool": base}[kind]

    def footprint():
        return pool.pool_size if kind != "driver-pool" else base.pool.reserved_mem_high
    return _explicit_stream_peer(mr.allocate, mr.deallocate, streams, streams, footprint)


def cupy_peer(kind, streams):
    import cupy
    pool = cupy.cuda.MemoryPool() if kind == "MemoryPool" else cupy.cuda.MemoryAsyncPool()
    cs = [cupy.cuda.Stream.from_external(s) for s in streams]
    malloc = pool.malloc

    cs[0].use()  # stream 0 is current, as a CuPy user on one stream has it: no context switch

    def alloc(n, si):
        if si == 0:
            return malloc(n)
        with cs[si]:
            return malloc(n)

    def free(h, si, owner=None):
        if owner is not None and owner != si:
            streams[si].wait(streams[owner])
        del h

    def footprint():
        return pool.total_bytes()

    def pair_loop(n, count):  # stream 0 is current; the MemoryPointer dies at once and frees
        for _ in range(count):
            malloc(n)

    def batch_loop(sizes, order):
        mps = [malloc(n) for n in sizes]
        for i in order:
            mps[i] = None

    def random_loop(plan):  # a MemoryPointer dropped is a free
        live = []
        for is_alloc, n, r in plan:
            if is_alloc or not live:
                live.append(malloc(n))
            else:
                live.pop(int(r * len(live)))
        live.clear()
    return alloc, free, footprint, pair_loop, batch_loop, random_loop


def torch_peer(streams):
    import torch
    ts = [torch.cuda.ExternalStream(s.handle) for s in streams]
    ca, cd = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

    def alloc(n, si):
        return ca(n, 0, ts[si])

    def free(h, si, owner=None):
        if owner is not None and owner != si:
            streams[si].wait(streams[owner])
        cd(h)

    def footprint():
        return torch.cuda.max_memory_reserved()

    def pair_loop(n, count, s=ts[0]):
        for _ in range(count):
            cd(ca(n, 0, s))

    def batch_loop(sizes, order, s=ts[0]):
        ptrs = [ca(n, 0, s) for n in sizes]
        for i in order:
            cd(ptrs[i])

    def random_loop(plan, s=ts[0]):
        live = []
        for is_alloc, n, r in plan:
            if is_alloc or not live:
                live.append(ca(n, 0, s))
            else:
                cd(live.pop(int(r * len(live))))
        for h in live:
            cd(h)
    return alloc, free, footprint, pair_loop, batch_loop, random_loop


def rmm_peer(kind, streams):
    """RMM's resources through their Python allocate/deallocate (the same level as mrkit's calls)."""
    import rmm
    from rmm.pylibrmm.stream import Stream as RmmStream
    if kind == "pool":
        mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=2 << 20)
    elif kind == "arena":
        mr = rmm.mr.ArenaMemoryResource(rmm.mr.CudaMemoryResource())
    else:
        mr = rmm.mr.CudaAsyncMemoryResource()
    rs = [RmmStream(s) for s in streams]  # mrkit streams speak __cuda_stream__

    def footprint():
        return mr.pool_size() if kind == "pool" else float("nan")
    return _explicit_stream_peer(mr.allocate, mr.deallocate, rs, streams, footprint)


# -- workloads ---------------------------------------------------------------------------------------------------
def pairs(peer, n, count):
    loop = peer[3]  # each allocator's own tightest loop: one alloc+free on stream 0

    def run():
        loop(n, count)
        return count
    run()
    return _timeit(run, repeat=1)


def batch(peer, sizes, order, reps):
    loop = peer[4]  # each allocator's own loop: allocate all, free in random order

    def run():
        for _ in range(reps):
            loop(sizes, order)
        return reps * len(sizes)
    for _ in range(4):  # warm: a loop's sizes are hot from its fourth pass (the engine's HOT_REPEATS)
        loop(sizes, order)
    return _timeit(run, repeat=1)


def random_workload(peer, ops, seed=1, replay=True):
    """RMM's random workload, 50/50, sizes to 8 MiB, on stream 0: µs per operation, through each
    allocator's own loop (``peer[5]``: its calls as its users write them, as for pairs and the batch).
    ``replay``: one untimed run, then the same sizes again, timed (a replay); else the first run is
    timed (sizes new to the allocator, as far as ``seed`` is new)."""
    loop = peer[5]
    rng = random.Random(seed)
    plan = [(rng.random() < 0.5, rng.randint(1, 8 << 20), rng.random()) for _ in range(ops)]

    def run():
        loop(plan)
        return ops
    if replay:
        run()
    return _timeit(run, repeat=1)


def multistream(peer, ops, seed=2):
    alloc, free, footprint = peer[:3]
    rng = random.Random(seed)
    plan = [(rng.randrange(8), rng.random() < 0.55, int(2 ** rng.uniform(8, 22)), rng.random(), rng.random() < 0.25)
            for _ in range(ops)]

    def run():
        live = []
        for si, is_alloc, n, r, cross in plan:
            if is_alloc or not live:
                live.append((alloc(n, si), si))
            else:
                h, owner = live.pop(int(r * len(live)))
                free(h, (owner + 1) % 8 if cross else owner, owner)
        for h, owner in live:
            free(h, owner, owner)
        return ops
    us = _timeit(run, repeat=2)
    return us, footprint()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per workload (best of)")
    args = ap.parse_args(argv)
    count = 5000 if args.quick else 20000
    streams = [Stream.create(0) for _ in range(8)]
    rng = random.Random(0)
    sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]
    order = list(range(1000))
    rng.shuffle(order)

    peers = {"mrkit pool": lambda: mrkit_peer("pool", streams),
             "mrkit driver pool": lambda: mrkit_peer("driver-pool", streams)}
    try:
        import cupy  # noqa: F401
        peers["cupy MemoryPool"] = lambda: cupy_peer("MemoryPool", streams)
        peers["cupy MemoryAsyncPool"] = lambda: cupy_peer("MemoryAsyncPool", streams)
    except ImportError:
        print("cupy not installed: skipped", file=sys.stderr)
    try:
        import torch
        if torch.cuda.is_available():
            peers["torch caching"] = lambda: torch_peer(streams)
    except ImportError:
        print("torch not installed: skipped", file=sys.stderr)
    try:
        import rmm  # noqa: F401
        for kind in ("pool", "arena", "async"):
            peers[f"rmm {kind}"] = (lambda k: lambda: rmm_peer(k, streams))(kind)
    except ImportError:
        print("rmm not installed: skipped (no wheels on this machine)", file=sys.stderr)

    # Speed: every allocator measured in turn, several rounds, best of each (the machine's noise then
    # hits all of them alike). Footprint: one fresh instance each on the multi-stream workload.
    objs = {name: make() for name, make in peers.items()}
    workloads = [(f"pair {n}", (lambda n: lambda p: pairs(p, n, count if n < (8 << 20) else count // 4))(n))
                 for n in (256, 64 << 10, 8 << 20)]
    workloads += [("batch", lambda p: batch(p, sizes, order, 3 if args.quick else 10)),
                  ("random", lambda p: random_workload(p, 4000 if args.quick else 10000))]
    results = {name: {} for name in peers}
    for key, fn in workloads:
        for _ in range(args.rounds):
            for name, p in objs.items():
                results[name][key] = min(results[name].get(key, math.inf), fn(p))
    objs = None
    for name, make in peers.items():
        r = results[name]
        us, fp = multistream(make(), 4000 if args.quick else 8000)
        r["streams"] = us
        r["streams footprint MiB"] = fp / 2**20
        print(name, {k: round(v, 3) for k, v in r.items()}, flush=True)
    for s in streams:
        s.synchronize()

    # adaptor overhead: the bare pool and each adaptor measured in turn, several rounds, best of each
    loops = {k: mrkit_peer(k, streams)[3] for k in ("pool", "stats", "log")}
    best = dict.fromkeys(loops, math.inf)
    for _ in range(5):
        for k, loop in loops.items():
            best[k] = min(best[k], pairs((None, None, None, loop), 256, count))
    over = {k: (best[k] - best["pool"]) * 1e3 for k in ("stats", "log")}
    keys = list(next(iter(results.values())))
    lines = ["| allocator | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |")
    mine = results["mrkit pool"]
    for peer in ("cupy MemoryPool", "rmm pool", "torch caching"):
        ref = results.get(peer)
        if ref:
            lines.append(f"| **mrkit pool / {peer}** | " + " | ".join(f"{mine[k] / ref[k]:.2f}x" for k in keys) + " |")
    lines.append("")
    lines.append(f"adaptor overhead per 256 B pair: statistics {over['stats']:.0f} ns, logging {over['log']:.0f} ns")
    table = "\n".join(lines)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "adaptor_overhead_ns": over, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
