"""What statistics and the profiler cost: ns per allocate+free pair of 64 KiB on one stream, over
the pool alone, statistics(pool), statistics(pool) inside a ``statistics()`` scope (three nested), and
inside a ``profiler`` context; medians of alternating rounds, in one process.

Run: ``python benchmarks/bench_statistics.py [--pairs N] [--rounds R] [--backend sim|cuda] [--json out.json]``
(the GPU by default; the simulator with ``--backend sim``)."""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics as stats
import time

import mrkit
import mrkit.statistics as mst
from mrkit import DEFAULT_STREAM, DeviceMemoryResource, PoolResource, StatisticsAdaptor
from mrkit.driver import CudaDriver, SimDriver, use_backend


def _pairs(mr, n: int) -> float:
    alloc, free, s = mr.allocate, mr.deallocate, DEFAULT_STREAM
    t0 = time.perf_counter()
    for _ in range(n):
        free(alloc(65536, s), 65536, s)
    return (time.perf_counter() - t0) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", choices=["sim", "cuda"], default="cuda")
    ap.add_argument("--json")
    args = ap.parse_args()
    drv = SimDriver() if args.backend == "sim" else CudaDriver()
    with use_backend(drv):
        pool = PoolResource(DeviceMemoryResource(0, driver=drv))
        mrkit.set_current_resource(StatisticsAdaptor(pool))
        st = mrkit.get_current_resource()

        @contextlib.contextmanager
        def nested3():
            with mst.statistics(), mst.statistics(), mst.statistics():
                yield
        cases = {"pool": (pool, contextlib.nullcontext), "statistics(pool)": (st, contextlib.nullcontext),
                 "statistics(pool) in a statistics() scope": (st, mst.statistics),
                 "statistics(pool) in 3 nested scopes": (st, nested3),
                 "statistics(pool) in a profiler context": (st, lambda: mst.profiler(name="bench"))}
        samples = {k: [] for k in cases}
        for mr, ctx in cases.values():
            _pairs(mr, 2000)  # warm
        for _ in range(args.rounds):
            for name, (mr, ctx) in cases.items():
                with ctx():
                    samples[name].append(_pairs(mr, args.pairs))
        med = {k: stats.median(v) for k, v in samples.items()}
    base = med["pool"]
    print(f"| over {args.backend} ({drv.device_name(0)}) | ns per 64 KiB pair | overhead vs pool |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.0f} | {v - base:+.0f} ns |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "ns_per_pair": med}, f, indent=2)


if __name__ == "__main__":
    main()
