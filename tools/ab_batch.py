"""The batch loop of ``bench_core.py`` (1 000 log-uniform sizes of 256 B to 4 MiB made, then freed in
random order, every size cached after the warm loops) through the VMM and the pool of several trees,
each tree in its own process, the trees taking turns; allocations and frees timed apart, ns each (best
of the timed loops), and CuPy's pool batch in the same process where CuPy and a GPU are there.

Only the public API, so any tree runs it (2026-12-03's included): the way to compare builds and trees
where the host's speed drifts between processes (read the ratio to CuPy within a process).

    MRKIT_NO_EXTENSIONS=1 MRKIT_BACKEND=sim python tools/ab_batch.py . OLD_TREE [--turns 2]

``OLD_TREE``: a checkout or ``git archive`` of the earlier tree (its extension built in place for the
compiled build)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

_CHILD = r"""
import random, sys, time
import mrkit
from mrkit import DeviceMemoryResource, PoolResource, VirtualMemoryResource
rng = random.Random(0)
sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]
order = list(range(1000))
rng.shuffle(order)
s = mrkit.DEFAULT_STREAM
print("  ", mrkit.__file__)
for kind in ("vmm", "pool"):
    mr = VirtualMemoryResource(0) if kind == "vmm" else PoolResource(DeviceMemoryResource(0))
    a, f = mr.allocate, mr.deallocate
    ta = tf = tb = 1e9
    for k in range(40):
        t0 = time.perf_counter()
        ptrs = [a(n, s) for n in sizes]
        t1 = time.perf_counter()
        pairs = [(ptrs[i], sizes[i]) for i in order]
        t2 = time.perf_counter()
        for p, n in pairs:
            f(p, n, s)
        t3 = time.perf_counter()
        if k >= 10:
            ta, tf, tb = min(ta, t1 - t0), min(tf, t3 - t2), min(tb, (t1 - t0) + (t3 - t2))
    print(f"   {kind}: allocate {ta * 1e6:.0f} ns, free {tf * 1e6:.0f} ns, pair {tb * 1e6:.0f} ns")
try:
    import cupy
    malloc = cupy.cuda.MemoryPool().malloc
    best = 1e9
    for k in range(25):
        t = time.perf_counter()
        mps = [malloc(n) for n in sizes]
        for i in order:
            mps[i] = None
        if k >= 10:
            best = min(best, time.perf_counter() - t)
    print(f"   cupy MemoryPool: pair {best * 1e6:.0f} ns")
except Exception as exc:  # no CuPy, or no GPU
    print(f"   (no CuPy batch: {type(exc).__name__})")
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--turns", type=int, default=2)
    args = ap.parse_args(argv)
    for _ in range(args.turns):
        for tree in args.trees:
            print(f"== {tree}", flush=True)
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            # run from the tree's parent-free temporary place: the current directory must not shadow it
            subprocess.run([sys.executable, "-W", "ignore", "-c", _CHILD], env=env, check=True, cwd="/")


if __name__ == "__main__":
    main()
