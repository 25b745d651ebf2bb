"""Where the VirtualMemoryResource's time goes on RMM's random workload: driver calls by kind.

The plan of ``bench_workload.py`` (sizes up to ``--max-size``, live bytes capped at 16 GiB), replayed
``--passes`` times on one resource (everything freed between passes). For each pass: µs per operation,
the part of it spent in driver calls, physical moves, the number of mappings held at the start of the
pass, and every driver function called (count, total ms, µs per call). Shows what bounds the
footprint-limited VMM: each moved mapping costs an unmap, a map and its share of an access call.

    python benchmarks/bench_vmm_calls.py --max-size 4GiB --footprint-limit 1.1 [--max-mapping 256MiB]
    python benchmarks/bench_vmm_calls.py --backend sim ...   (the simulator: counts, not times, and
        the H200 driver time those calls would take by the probe's per-call costs, :func:`model_driver`)
    python benchmarks/bench_vmm_calls.py --fresh ...         (new sizes every pass, not a replay)
    python benchmarks/bench_vmm_calls.py --runs-per-block 4 ...  (the trade: fewer, larger runs per block
        under a limit make fewer driver calls and strand more; a request the bound cannot serve is
        refused, and the refusals are counted)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("bench_workload", os.path.join(os.path.dirname(__file__), "bench_workload.py"))
bench_workload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_workload)

GiB = 1 << 30

# What each VMM driver call costs on the H200, microseconds, fitted to tools/probe_vmm.py's medians
# (benchmarks/HISTORY.md, "What each VMM driver step costs on the H200"; run 18 for 4 GiB): a fixed
# part per call (per mapping for an unmap or an access call, which cost per mapping they cover,
# whatever the range) and a part per GiB of each mapping or allocation.
H200_COSTS = {  # call: (µs per call or per mapping covered, µs per GiB)
    "mem_create": (10.0, 6.0),
    "mem_map": (2.0, 0.0),
    "mem_set_access": (25.0, 25.0),
    "mem_unmap": (18.0, 8.5),
    "mem_release": (10.0, 270.0),
}


def model_driver(drv, costs: dict = H200_COSTS) -> list:
    """Charge every VMM call made through ``drv`` (the simulator) what it would cost on the GPU that
    ``costs`` describes: returns a one-element list holding the modelled microseconds so far. An access
    call or an unmap is charged per mapping it covers (the driver's cost is per mapping, not per
    range: 32 adjacent 2 MiB mappings in one access call took 32 times one), a create and a release by
    the allocation's size."""
    spent, mapped, sizes = [0.0], {}, {}  # mapped: address -> bytes of each mapping; sizes: handle -> bytes
    real = {name: getattr(drv, name) for name in costs}

    def charge(name, nbytes):
        fixed, per_gib = costs[name]
        spent[0] += fixed + per_gib * nbytes / GiB

    def covered(ptr, nbytes):
        return [a for a in mapped if ptr <= a < ptr + nbytes]

    def mem_create(location, nbytes, *a, **k):
        h = real["mem_create"](location, nbytes, *a, **k)
        sizes[h] = nbytes
        charge("mem_create", nbytes)
        return h

    def mem_map(ptr, nbytes, offset, handle, *a, **k):
        r = real["mem_map"](ptr, nbytes, offset, handle, *a, **k)
        mapped[ptr] = nbytes
        charge("mem_map", nbytes)
        return r

    def mem_set_access(ptr, nbytes, *a, **k):
        r = real["mem_set_access"](ptr, nbytes, *a, **k)
        for m in covered(ptr, nbytes):
            charge("mem_set_access", mapped[m])
        return r

    def mem_unmap(ptr, nbytes, *a, **k):
        r = real["mem_unmap"](ptr, nbytes, *a, **k)
        for m in covered(ptr, nbytes):
            charge("mem_unmap", mapped.pop(m))
        return r

    def mem_release(handle, *a, **k):
        r = real["mem_release"](handle, *a, **k)
        charge("mem_release", sizes.pop(handle, 0))
        return r
    for name, fn in (("mem_create", mem_create), ("mem_map", mem_map), ("mem_set_access", mem_set_access),
                     ("mem_unmap", mem_unmap), ("mem_release", mem_release)):
        setattr(drv, name, fn)
    return spent


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-size", type=bench_workload._size, default=4 * GiB)
    ap.add_argument("--ops", type=bench_workload._positive, default=1000)
    ap.add_argument("--passes", type=bench_workload._positive, default=3)
    ap.add_argument("--footprint-limit", type=float)
    ap.add_argument("--max-mapping", type=bench_workload._size)
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--runs-per-block", type=bench_workload._positive,
                    help="under a footprint limit, a block's new pages come in runs of 1/N of it (default 8)")
    ap.add_argument("--fresh", action="store_true",
                    help="new sizes from the same distribution every pass (RMM's rules as bench_workload times them)")
    args = ap.parse_args(argv)
    import mrkit
    if args.runs_per_block:
        from mrkit.resources import _vmm
        _vmm._RUNS_PER_BLOCK = args.runs_per_block
    if args.backend == "sim":
        from mrkit.driver import SimDeviceSpec, SimDriver
        drv = SimDriver(devices=[SimDeviceSpec(total_memory=141 * GiB)], policy="eager")
    else:
        drv = mrkit.get_driver()  # the driver loads lazily: a missing one shows on first use, below
    try:
        opts = mrkit.VirtualMemoryResourceOptions(reserve_size=512 * GiB, footprint_limit=args.footprint_limit,
                                                  max_mapping=args.max_mapping)
    except ValueError as exc:  # footprint_limit below 1.0: one line naming the argument
        ap.error(str(exc))
    try:
        mr = mrkit.VirtualMemoryResource(0, opts, driver=drv)
    except mrkit.CUDAUnavailableError as exc:  # one line, not a traceback
        ap.error(f"{str(exc).split(' (')[0]}; --backend sim counts the calls without a GPU")
    modelled = model_driver(drv) if args.backend == "sim" else None
    calls: dict = {}
    spent = bench_workload._time_driver(drv, calls)
    s = mrkit.DEFAULT_STREAM
    steps = bench_workload.plan(args.ops, args.max_size, 16 * GiB)
    print(f"VirtualMemoryResource(footprint_limit={opts.footprint_limit}, max_mapping={opts.max_mapping}) on "
          f"{drv.name}: sizes up to "
          f"{args.max_size / GiB:g} GiB, {len(steps)} operations per pass")
    for p in range(args.passes):
        if args.fresh and p:
            steps = bench_workload.plan(args.ops, args.max_size, 16 * GiB, seed=7 + p)
        calls.clear()
        moves, maps, in_driver = mr.moves, len(mr._src._maps), spent[0]
        model0 = modelled[0] if modelled else 0.0
        refused, missed = [0], [0]  # missed: allocations that made a map call

        def alloc(n):
            before = calls.get("mem_map", (0,))[0]
            try:
                return mr.allocate(n, s)
            except mrkit.OutOfMemoryError:  # the footprint bound refused it: counted, the plan goes on
                refused[0] += 1
                return None
            finally:
                missed[0] += calls.get("mem_map", (0,))[0] > before

        def free(p, n):
            if p is not None:
                mr.deallocate(p, n, s)
        dt = bench_workload.replay(steps, alloc, free)
        print(f"pass {p}: {dt * 1e6 / len(steps):.2f} us/op, {(spent[0] - in_driver) * 1e6 / len(steps):.2f} in "
              f"driver calls; {mr.moves - moves} moves; {maps} mappings held at the start; physical high "
              f"{mr.mapped_high / GiB:.2f} GiB; "
              f"{sum(calls.get(k, (0, 0))[0] for k in ('mem_map', 'mem_unmap')) / sum(op == 'a' for op, *_ in steps):.2f} "
              f"map/unmap calls per allocation; {missed[0] / len(steps):.3f} misses per operation (allocations that "
              f"mapped), {calls.get('mem_map', (0,))[0] / max(missed[0], 1):.1f} maps per miss; {refused[0]} refused"
              + (f"; modelled H200 driver time {(modelled[0] - model0) / len(steps):.2f} us/op" if modelled else ""))
        for name, (count, sec) in sorted(calls.items(), key=lambda c: -c[1][1]):
            print(f"    {name:20s} {count:6d} calls {sec * 1e3:9.2f} ms {sec * 1e6 / count:9.1f} us/call")
    mr.close()


if __name__ == "__main__":
    main()
