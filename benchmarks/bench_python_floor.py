"""What a pure-Python pool cannot go below: the parts of a cache miss, timed in CPython on the machine
that runs CuPy's pool, beside CuPy's whole operation on the same plan.

RMM's random workload (the plan of ``bench_workload.py``, sizes up to ``--max-size``, 16 GiB cap) is
replayed warm against: an empty loop (the benchmark's own cost); a lock taken and released per
operation; mrkit's size-class ``FreeList`` best fit and coalescing insert under a lock (no stream
states, no live table, no validation: the data-structure floor of any Python pool with coalescing);
``PoolResource`` over ``cuMemAlloc``; CuPy's ``MemoryPool`` (compiled). Microseconds per operation,
best of ``--rounds``.

    python benchmarks/bench_python_floor.py [--max-size 1GiB] [--rounds 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
_spec = importlib.util.spec_from_file_location("bench_workload", os.path.join(os.path.dirname(__file__), "bench_workload.py"))
bench_workload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_workload)


def main(argv=None) -> None:
    from mrkit import parse_size
    from mrkit._engine._freelist import FreeList
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-size", type=parse_size, default=parse_size("1GiB"))
    ap.add_argument("--ops", type=bench_workload._positive, default=1000)
    ap.add_argument("--rounds", type=bench_workload._positive, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    steps = bench_workload.plan(args.ops, args.max_size, 16 << 30)
    rows = {}

    def best(alloc, free):
        bench_workload.replay(steps, alloc, free)  # warm
        return min(bench_workload.replay(steps, alloc, free) for _ in range(args.rounds)) * 1e6 / len(steps)

    rows["empty loop"] = best(lambda n: n, lambda h, n: None)
    lock = threading.Lock()

    def locked(n):
        with lock:
            return n

    def unlocked(h, n):
        with lock:
            pass
    rows["a lock per operation"] = best(locked, unlocked)
    fl, boundaries = FreeList(), set()
    fl.add(1 << 40, 1 << 40)

    def fl_alloc(n):
        with lock:
            return fl.take((n + 255) & -256)

    def fl_free(p, n):
        with lock:
            fl.insert(p, (n + 255) & -256, boundaries)
    rows["FreeList best fit + coalescing insert, locked"] = best(fl_alloc, fl_free)
    try:
        import mrkit
        mrkit.DEFAULT_STREAM  # noqa: B018
        mr = mrkit.PoolResource(mrkit.CudaMemoryResource(0))
        s = mrkit.DEFAULT_STREAM
        a, d = mr.allocate, mr.deallocate
        rows["mrkit PoolResource(CudaMemoryResource)"] = best(lambda n: a(n, s), lambda p, n: d(p, n, s))
        mr.release()
    except Exception as exc:  # noqa: BLE001 - no GPU: the Python parts still mean something
        print(f"mrkit pool skipped: {exc}", file=sys.stderr)
    try:
        import cupy
        pool = cupy.cuda.MemoryPool()
        rows["CuPy MemoryPool"] = best(pool.malloc, lambda h, n: None)
        pool.free_all_blocks()
    except Exception as exc:  # noqa: BLE001
        print(f"CuPy skipped: {exc}", file=sys.stderr)
    print(f"| random sizes to {args.max_size >> 20} MiB, warm, {len(steps)} operations | us per operation |")
    print("|---|---|")
    for name, us in rows.items():
        print(f"| {name} | {us:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
