"""The VMM's workloads on the simulator for this tree and an earlier one, each run in its own process,
the trees taking turns (both builds: ``MRKIT_NO_EXTENSIONS=1`` for the Python one):

* ``batch`` — ``bench_pool.batch``: 1 000 sizes of 256 B to 1 MiB allocated, then freed in random
  order, ns per pair (best of three timings of ten loops, after the warm loops);
* ``random`` — ``bench_pool.random_workload`` (RMM's rules, sizes to 8 MiB), ns per operation with new
  sizes each pass and replayed (best of ``--passes``), and the footprint;
* ``small`` — allocations and frees interleaved at random over 300 sizes of at most two pages with at
  most 16 blocks live (no loop to settle on), ns per operation.

    python tools/ab_vmm.py OLD_TREE [--runs 4] [--passes 8]

``OLD_TREE`` is a checkout or ``git archive`` of the earlier tree with its extension built in place
(``python setup.py build_ext --inplace`` there). This tree's benchmark scripts run for both."""
from __future__ import annotations

from ab_random import HERE, parse, run_child  # this script's directory is first on the path

_CHILD = r"""
import json, os, random, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import mrkit
from mrkit import Stream, VirtualMemoryResource, VirtualMemoryResourceOptions
from mrkit.driver import SimDeviceSpec, SimDriver
mrkit.set_backend(SimDriver(devices=[SimDeviceSpec(total_memory=141 << 30)]))
import bench_pool as bp
passes = int(sys.argv[2])
streams = [Stream.create(0) for _ in range(8)]
out = {"file": mrkit.__file__, "core": mrkit._engine.core_name()}
rng = random.Random(3)
sizes = [int(2 ** rng.uniform(8, 20)) for _ in range(1000)]
order = list(range(1000))
rng.shuffle(order)
peer = bp.mrkit_peer("vmm", streams)
out["batch"] = min(bp.batch(peer, sizes, order, 10) * 1000 for _ in range(3))
peer = bp.mrkit_peer("vmm", streams)
for k in range(3):
    bp.random_workload(peer, 4000, seed=100 + k, replay=False)
out["fresh"] = min(bp.random_workload(peer, 4000, seed=200 + k, replay=False) * 1000 for k in range(passes))
out["replayed"] = min(bp.random_workload(peer, 4000, seed=400 + k, replay=True) * 1000 for k in range(passes))
out["footprint"] = peer[2]()
vmm = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=2 << 30))
page = vmm.arena.source.page
rng = random.Random(8)
small = [rng.randrange(1, 2 * page) for _ in range(300)]
s, live, ops = streams[0], [], 30000
t = time.perf_counter()
for _ in range(ops):
    if live and (len(live) > 16 or rng.random() < 0.5):
        p, n = live.pop(rng.randrange(len(live)))
        vmm.deallocate(p, n, s)
    else:
        n = rng.choice(small)
        live.append((vmm.allocate(n, s), n))
out["small"] = (time.perf_counter() - t) / ops * 1e9
for p, n in live:
    vmm.deallocate(p, n, s)
print(json.dumps(out))
"""


def main(argv=None) -> None:
    args = parse(__doc__, argv, 4, passes=8)
    for k in range(args.runs):
        for name, tree in (("old", args.old.resolve()), ("new", HERE)):
            r = run_child(tree, _CHILD, args.passes)
            print(f"{name} ({r['core']}), run {k}: batch {r['batch']:.0f} ns a pair; random {r['fresh']:.0f} ns "
                  f"fresh, {r['replayed']:.0f} replayed, footprint {r['footprint'] / 2**20:.0f} MiB; "
                  f"small sizes interleaved {r['small']:.0f} ns", flush=True)


if __name__ == "__main__":
    main()
