"""Where the pool's time goes on RMM's random workload (new sizes each pass), by cProfile, on whatever
backend runs: ``python tools/probe_random.py [pool|vmm] [ops]``. Prints µs/op unprofiled, then the
top functions by own time, and the pool's counters (misses, upstream chunks)."""
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_pool as bp  # noqa: E402

from mrkit import Stream  # noqa: E402

kind = sys.argv[1] if len(sys.argv) > 1 else "pool"
ops = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
streams = [Stream.create(0) for _ in range(8)]
peer = bp.mrkit_peer(kind, streams)
for k in range(3):
    bp.random_workload(peer, ops, seed=100 + k)
t = time.perf_counter()
us = [bp.random_workload(peer, ops, seed=200 + k) for k in range(3)]
print(f"{kind}: {min(us):.2f} us/op unprofiled (passes {', '.join(f'{u:.2f}' for u in us)})")
pr = cProfile.Profile()
pr.enable()
for k in range(3):
    bp.random_workload(peer, ops, seed=300 + k)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
