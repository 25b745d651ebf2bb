"""The batch loop of ``bench_core.py`` (1 000 log-uniform sizes of 256 B to 4 MiB made, then freed in
random order, every size cached after the warm loops) through the VMM and the pool of this tree and an
earlier one, each run in its own process, the trees taking turns: allocations and frees timed apart,
ns each (best of the timed loops), and CuPy's pool batch in the same process where CuPy and a GPU are
there (compare the ratio to it within a process: the host's speed drifts between processes).

Only the public API runs in the child, so any earlier tree runs it (2026-12-03's included, which
``tools/ab_vmm.py``'s benchmark scripts do not import). On the simulator with ``MRKIT_BACKEND=sim``;
both builds (``MRKIT_NO_EXTENSIONS=1`` for the Python one):

    MRKIT_NO_EXTENSIONS=1 MRKIT_BACKEND=sim python tools/ab_batch.py OLD_TREE [--runs 2]

``OLD_TREE``: a checkout or ``git archive`` of the earlier tree (its extension built in place for the
compiled build)."""
from __future__ import annotations

from ab_random import HERE, parse, run_child  # this script's directory is first on the path

_CHILD = r"""
import json, random, time
import mrkit
from mrkit import DeviceMemoryResource, PoolResource, VirtualMemoryResource
rng = random.Random(0)
sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]
order = list(range(1000))
rng.shuffle(order)
s = mrkit.DEFAULT_STREAM
out = {"file": mrkit.__file__}
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
    out[kind] = {"allocate": ta * 1e6, "free": tf * 1e6, "pair": tb * 1e6}
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
    out["cupy"] = best * 1e6
except Exception as exc:  # no CuPy, or no GPU
    out["cupy"] = type(exc).__name__
print(json.dumps(out))
"""


def main(argv=None) -> None:
    args = parse(__doc__, argv, 2)
    for k in range(args.runs):
        for name, tree in (("old", args.old.resolve()), ("new", HERE)):
            r = run_child(tree, _CHILD)
            cupy = f"{r['cupy']:.0f} ns a pair" if isinstance(r["cupy"], float) else f"not run ({r['cupy']})"
            rows = "; ".join(f"{kind}: allocate {r[kind]['allocate']:.0f} ns, free {r[kind]['free']:.0f} ns, "
                             f"pair {r[kind]['pair']:.0f} ns" for kind in ("vmm", "pool"))
            print(f"{name}, run {k}: {rows}; CuPy's pool batch {cupy}", flush=True)


if __name__ == "__main__":
    main()
