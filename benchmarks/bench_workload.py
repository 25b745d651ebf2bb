"""Real workloads, every allocator in a fresh process per case, footprint counted by the driver.

RMM's random-allocation workload: sizes uniform in [1, max] for max = 64 MiB, 1 GiB and 4 GiB; the
live bytes first grow to the cap (16 GiB), then allocations and frees alternate at random (50/50, a
random live block freed), ``--ops`` operations in all. Each case runs in its own process: a first
pass samples ``cuMemGetInfo`` after every allocation (the footprint: peak device memory in use by the
driver's count, minus what was in use before the allocator existed, over the peak live bytes), then
``--passes`` warm passes (default 3) are timed, each on new sizes from the same distribution (so no
allocator profits from an exact replay) and each through the allocator's own loop (its calls as its
users write them, no wrapper between: CuPy's ``malloc(n)`` and a dropped pointer, mrkit's
``allocate(n, s)``/``deallocate(p, n, s)``), and the fastest is reported in us per operation (the GPU
machine's CPU speed drifts, and a single pass of a few milliseconds caught the drift); ``--repeat N``
runs each case in N fresh processes and keeps the fastest (a process lands on whichever core it is
given: the same case took 2.3 and 4.0 us in two processes a minute apart). For mrkit, the
share of its time spent in driver calls (mapping, unmapping, synchronising) is shown in brackets:
it is measured on one more pass of new sizes with mrkit's driver calls wrapped in timers (JSON
``driver_us_per_op`` of ``driver_pass_us_per_op``), so the timed passes carry no timing overhead that
the other libraries do not.
Fragmentation: the same workload with sizes up to 1 GiB and the cap at 90 % and 95 % of the device's
memory: which allocators finish without running out of memory, at what cost.

    python benchmarks/bench_workload.py [--ops 4000] [--json out.json] [--plot out.png]
    python benchmarks/bench_workload.py --case "mrkit pool" --max-size 1GiB --cap 16GiB   (one case)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

GiB, MiB = 1 << 30, 1 << 20
ALLOCATORS = ["mrkit pool", "mrkit pool(cuda)", "mrkit vmm", "mrkit vmm footprint_limit=1.1",
              "mrkit vmm footprint_limit=1.1 max_mapping=64MiB", "cupy MemoryPool",
              "torch caching", "torch expandable segments", "rmm pool", "rmm arena", "rmm binning",
              "rmm async"]
_NEEDS = {"cupy": "cupy", "torch": "torch", "rmm": "rmm"}


def plan(ops: int, max_size: int, cap: int, seed: int = 7) -> list[tuple]:
    """The steps of one pass: ``("a", nbytes, key)`` / ``("f", nbytes, key)``, by the rules that
    ``MRKIT_BENCH_RULES`` names (``--rules``): ``bench`` (default: grow to the cap, then frees and
    allocations 50/50) or ``rmm`` (:func:`plan_rmm`)."""
    if os.environ.get("MRKIT_BENCH_RULES", "bench") == "rmm":
        return plan_rmm(ops, max_size, cap, seed)
    rng = random.Random(seed)
    steps, live, cur = [], [], 0
    filling = True
    while len(steps) < ops:
        n = rng.randint(1, max_size)
        if filling and cur + n > cap:
            filling = False
        if live and (not filling and (rng.random() < 0.5 or cur + n > cap)):
            cur -= _free_one(rng, live, steps)
        elif cur + n <= cap:
            cur += _allocate_one(n, live, steps)
    return steps


def _free_one(rng, live: list, steps: list) -> int:
    """Free a random live block (a step); its size."""
    k, m = live.pop(rng.randrange(len(live)))
    steps.append(("f", m, k))
    return m


def _allocate_one(n: int, live: list, steps: list) -> int:
    """Allocate ``n`` bytes (a step); ``n``."""
    steps.append(("a", n, len(steps)))
    live.append((len(steps) - 1, n))
    return n


def plan_rmm(ops: int, max_size: int, cap: int, seed: int = 7) -> list[tuple]:
    """RMM's ``random_allocations`` rules: each step allocates with probability 73 % (else frees a
    random live block) until ``ops`` allocations were made; an allocation that would pass the live
    cap frees instead; then every block still live is freed in random order."""
    rng = random.Random(seed)
    steps, live, cur, made = [], [], 0, 0
    while made < ops:
        n = rng.randint(1, max_size)
        if live and (rng.random() >= 0.73 or cur + n > cap):
            cur -= _free_one(rng, live, steps)
        elif cur + n <= cap:
            cur += _allocate_one(n, live, steps)
            made += 1
    rng.shuffle(live)
    steps.extend(("f", m, k) for k, m in live)
    return steps


def replay(steps, alloc, free) -> float:
    """Run ``steps`` (see :func:`plan`) through ``alloc(n) -> handle`` / ``free(handle, n)``; returns the
    seconds it took. The blocks still live at the end are freed afterwards, untimed."""
    handles = {}
    t = time.perf_counter()
    for kind, n, k in steps:
        if kind == "a":
            handles[k] = alloc(n)
        else:
            free(handles.pop(k), n)
    dt = time.perf_counter() - t
    sizes = {k: n for kind, n, k in steps if kind == "a"}
    for k, h in handles.items():
        free(h, sizes[k])
    return dt


def _used(cuda) -> int:
    free, total = cuda.cuMemGetInfo()[1:]
    return total - free


_DRIVER_CALLS = ("mem_create", "mem_map", "mem_unmap", "mem_set_access", "mem_release", "stream_synchronize",
                 "ctx_synchronize", "event_create", "event_record", "event_query", "event_synchronize",
                 "event_destroy", "mem_alloc", "mem_free", "mem_alloc_from_pool_async", "mem_free_async")


def _time_driver(drv, calls: dict | None = None) -> list:
    """Time every call mrkit makes through ``drv`` to the memory and synchronisation functions: returns
    a one-element list holding the seconds spent in them so far (the driver's share of a case); with
    ``calls``, also ``calls[name] = [count, seconds]`` per function."""
    spent = [0.0]
    clock = time.perf_counter
    for name in _DRIVER_CALLS:
        fn = getattr(drv, name, None)
        if fn is None:
            continue

        def timed(*a, _fn=fn, _name=name, **k):
            t = clock()
            try:
                return _fn(*a, **k)
            finally:
                dt = clock() - t
                spent[0] += dt
                if calls is not None:
                    c = calls.setdefault(_name, [0, 0.0])
                    c[0] += 1
                    c[1] += dt
        setattr(drv, name, timed)
    return spent


def _loop_explicit(a, d, s):
    """A timed pass through an allocator whose calls take the stream (mrkit): ``a(n, s)`` and
    ``d(ptr, n, s)`` called as its users call them, no wrapper between."""
    def run(steps, handles):
        for kind, n, k in steps:
            if kind == "a":
                handles[k] = a(n, s)
            else:
                d(handles.pop(k), n, s)
    return run


def _loop_implicit(a, d):
    """A timed pass through ``a(n)`` and ``d(handle, n)`` (RMM's calls, the stream left to its default)."""
    def run(steps, handles):
        for kind, n, k in steps:
            if kind == "a":
                handles[k] = a(n)
            else:
                d(handles.pop(k), n)
    return run


def _make(name: str):
    """(alloc(n) -> handle, free(handle, n), close(), moves(), driver, run(steps, handles)) for
    allocator ``name``; the driver (mrkit's, whose calls :func:`_time_driver` can time) is None for
    other libraries; ``run`` is the timed passes' loop, each allocator called as its users call it
    (``alloc``/``free`` serve the untimed passes)."""
    if name.startswith("mrkit"):
        import mrkit
        s = mrkit.DEFAULT_STREAM
        if name == "mrkit pool":
            mr = mrkit.PoolResource(mrkit.DeviceMemoryResource(0))
        elif name == "mrkit pool(cuda)":  # over cuMemAlloc, as CuPy's pool is over cudaMalloc
            mr = mrkit.PoolResource(mrkit.CudaMemoryResource(0))
        else:
            opts = {"footprint_limit": 1.1} if "footprint_limit" in name else {}
            if "max_mapping=" in name:
                opts["max_mapping"] = name.split("max_mapping=")[1]
            mr = mrkit.VirtualMemoryResource(0, mrkit.VirtualMemoryResourceOptions(reserve_size=512 * GiB, **opts))
        a, d = mr.allocate, mr.deallocate
        return (lambda n: a(n, s)), (lambda p, n: d(p, n, s)), mr.close, (lambda: getattr(mr, "moves", 0)), \
            mr.arena.driver, _loop_explicit(a, d, s)
    if name == "cupy MemoryPool":
        import cupy
        pool = cupy.cuda.MemoryPool()
        malloc = pool.malloc

        def run(steps, handles):  # a MemoryPointer dropped is a free
            for kind, n, k in steps:
                if kind == "a":
                    handles[k] = malloc(n)
                else:
                    del handles[k]
        return malloc, (lambda h, n: None), pool.free_all_blocks, (lambda: 0), None, run
    if name.startswith("torch"):
        import torch
        ca, cd = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

        def run(steps, handles):
            for kind, n, k in steps:
                if kind == "a":
                    handles[k] = ca(n)
                else:
                    cd(handles.pop(k))
        return ca, (lambda h, n: cd(h)), torch.cuda.empty_cache, (lambda: 0), None, run
    if name.startswith("rmm"):
        import rmm
        cuda_mr = rmm.mr.CudaMemoryResource()
        mr = {"rmm pool": lambda: rmm.mr.PoolMemoryResource(cuda_mr),  # RMM's defaults: half the device up front
              "rmm arena": lambda: rmm.mr.ArenaMemoryResource(cuda_mr),
              "rmm binning": lambda: rmm.mr.BinningMemoryResource(rmm.mr.PoolMemoryResource(cuda_mr), 18, 22),
              "rmm async": rmm.mr.CudaAsyncMemoryResource}[name]()
        return mr.allocate, mr.deallocate, (lambda: None), (lambda: 0), None, _loop_implicit(mr.allocate, mr.deallocate)
    raise ValueError(name)


def one_case(name: str, max_size: int, cap: int, ops: int, passes: int = 3) -> dict:
    """Run one case in this process (see the module docstring): a sampled pass, then ``passes``
    timed ones, the fastest reported."""
    from cuda.bindings import driver as cuda
    cuda.cuInit(0)
    ctx = cuda.cuDevicePrimaryCtxRetain(cuda.cuDeviceGet(0)[1])[1]
    cuda.cuCtxSetCurrent(ctx)  # cuMemGetInfo needs a current context on this thread
    if name.startswith("torch"):
        import torch
        torch.cuda.init()
    if name.startswith("cupy"):
        import cupy
        cupy.cuda.Device(0).use()
    cuda.cuCtxSynchronize()
    base = _used(cuda)
    plans = [plan(ops, max_size, cap, seed=7 + p) for p in range(1 + passes)]  # timed passes: new sizes
    steps = plans[0]
    alloc, free, close, moves, drv, run = _make(name)
    if drv is not None:  # one more pass, with mrkit's driver calls timed (not the timed passes: no overhead there)
        plans.append(plan(ops, max_size, cap, seed=8 + passes))
    out = {"allocator": name, "max_size": max_size, "cap": cap, "ops": len(steps), "passes": passes,
           "finished": True}
    peak_live = peak_used = 0
    for i, steps in enumerate(plans):
        sample, timed = i == 0, 1 <= i <= passes
        if i == passes + 1:
            in_driver = _time_driver(drv)
        sizes = {k: n for kind, n, k in steps if kind == "a"}
        handles, cur, done = {}, 0, 0
        t0 = time.perf_counter()
        try:
            if timed:
                run(steps, handles)  # the allocator's own loop, nothing else timed
            else:
                for done, (kind, n, k) in enumerate(steps):
                    if kind == "a":
                        handles[k] = alloc(n)
                        cur += n
                        if sample:
                            peak_live = max(peak_live, cur)
                            peak_used = max(peak_used, _used(cuda) - base)
                    else:
                        free(handles.pop(k), n)
                        cur -= n
        except Exception as exc:  # noqa: BLE001 - out of memory, whatever the library calls it
            if timed:  # the allocator's own loop counts nothing: the live blocks say what was live
                cur, done = sum(sizes[k] for k in handles), None
            out.update(finished=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}",
                       done_ops=done, live_at_failure=cur)
            for k, h in list(handles.items()):
                free(h, sizes[k])
            break
        dt = time.perf_counter() - t0
        if timed and dt * 1e6 / len(steps) < out.get("us_per_op", float("inf")):  # the fastest pass
            out["us_per_op"] = dt * 1e6 / len(steps)
        elif i == passes + 1:  # the driver's share, on a pass of its own
            out["driver_us_per_op"] = in_driver[0] * 1e6 / len(steps)
            out["driver_pass_us_per_op"] = dt * 1e6 / len(steps)
        for k, h in list(handles.items()):
            free(h, sizes[k])
    out["peak_live"] = peak_live
    out["footprint"] = peak_used / peak_live if peak_live else None
    out["moves"] = moves()
    out["moves_per_op"] = out["moves"] / sum(len(p) for p in plans)  # over every pass
    close()
    return out


def _best_case(name, max_size, cap, ops, timeout, passes=3, repeat=1):
    """:func:`_run_case` in ``repeat`` fresh processes: the first one's record, with the fastest
    process's time (a process lands on whichever core the machine gives it)."""
    first = _run_case(name, max_size, cap, ops, timeout, passes)
    first["processes"] = 1
    while first["processes"] < repeat and first.get("finished"):
        r = _run_case(name, max_size, cap, ops, timeout, passes)
        if r.get("finished") and r["us_per_op"] < first["us_per_op"]:
            first.update(us_per_op=r["us_per_op"], driver_us_per_op=r.get("driver_us_per_op"),
                         driver_pass_us_per_op=r.get("driver_pass_us_per_op"))
        first["processes"] += 1
    return first


def _run_case(name, max_size, cap, ops, timeout, passes=3):
    env = dict(os.environ)
    if name == "torch expandable segments":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, __file__, "--case", name, "--max-size", str(max_size), "--cap", str(cap),
           "--ops", str(ops), "--passes", str(passes)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"allocator": name, "max_size": max_size, "cap": cap, "finished": False, "error": f"timeout {timeout}s"}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"allocator": name, "max_size": max_size, "cap": cap, "finished": False,
                "error": (r.stderr.strip().splitlines() or ["no output"])[-1][:200]}


def _importable(module: str | None) -> bool:
    if module is None:
        return True
    import importlib.util
    if importlib.util.find_spec(module) is None:
        print(f"skipping {module}: not installed", file=sys.stderr)
        return False
    return True


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _size(text: str) -> int:
    from mrkit import parse_size
    try:
        n = parse_size(text)
    except (ValueError, TypeError) as exc:  # argparse would only say "invalid _size value"
        raise argparse.ArgumentTypeError(str(exc)) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case")
    ap.add_argument("--max-size", type=_size)
    ap.add_argument("--cap", type=_size, default=16 * GiB)
    ap.add_argument("--ops", type=_positive, default=4000)
    ap.add_argument("--only", action="append", help="allocators to run, comma-separated (default: all)")
    ap.add_argument("--timeout", type=_positive, default=120, help="seconds per case")
    ap.add_argument("--passes", type=_positive, default=3, help="timed warm passes per case (the fastest is reported)")
    ap.add_argument("--repeat", type=_positive, default=1, help="fresh processes per case (the fastest is reported)")
    ap.add_argument("--no-fragmentation", action="store_true")
    ap.add_argument("--rules", choices=("bench", "rmm"), default=os.environ.get("MRKIT_BENCH_RULES", "bench"),
                    help="bench: grow to the cap, then 50/50 (default); rmm: RMM's random_allocations "
                         "(73 %% allocations until --ops allocations, then every block freed)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    os.environ["MRKIT_BENCH_RULES"] = args.rules  # the plan of this process and of every case's process
    only = [n.strip() for o in args.only or () for n in o.split(",")]  # --only a,b or --only a --only b
    unknown = [n for n in only + ([args.case] if args.case else []) if n not in ALLOCATORS]
    if unknown:
        ap.error(f"unknown allocator {unknown[0]!r}; choose from: {', '.join(ALLOCATORS)}")
    if args.case and args.max_size is None:
        ap.error("--case needs --max-size")
    try:
        from cuda.bindings import driver as cuda
        err, = cuda.cuInit(0)
        if err != cuda.CUresult.CUDA_SUCCESS:
            raise RuntimeError(err.name)
    except Exception as exc:  # noqa: BLE001 - no driver library, no device: one line, not a traceback
        ap.error(f"needs an NVIDIA GPU and its driver ({type(exc).__name__}: {exc})")
    if args.case:
        print(json.dumps(one_case(args.case, args.max_size, args.cap, args.ops, args.passes)))
        return
    total = cuda.cuDeviceTotalMem(cuda.cuDeviceGet(0)[1])[1]
    names = [n for n in (only or ALLOCATORS) if _importable(_NEEDS.get(n.split()[0]))]
    rows = []
    for max_size in (64 * MiB, 1 * GiB, 4 * GiB):
        for name in names:
            rows.append(_best_case(name, max_size, 16 * GiB, args.ops, args.timeout, args.passes, args.repeat))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if not args.no_fragmentation:
        for frac in (0.90, 0.95):
            for name in names:
                r = _best_case(name, 1 * GiB, int(total * frac), args.ops, args.timeout, args.passes, args.repeat)
                r["cap_fraction"] = frac
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    print("| allocator | " + " | ".join(f"≤ {m} µs/op, footprint" for m in ("64 MiB", "1 GiB", "4 GiB")) +
          " | 90 % of memory | 95 % of memory |")
    print("|---" * 6 + "|")
    for name in names:
        cells = []
        for r in rows:
            if r["allocator"] != name:
                continue
            if not r.get("finished"):
                err = r.get("error", "")
                oom = "OutOfMemory" in err or any(t in err.lower() for t in ("out of memory", "out_of_memory"))
                cells.append(f"OOM ({err[:40]})" if oom else f"failed ({err[:40]})")
            else:
                mv = f", {r['moves_per_op']:.2f} moves/op" if r.get("moves") else ""
                drv, whole = r.get("driver_us_per_op"), r.get("driver_pass_us_per_op")
                drv = f" ({100 * drv / whole:.0f} % in the driver)" if drv and whole and drv >= 0.05 else ""
                cells.append(f"{r['us_per_op']:.2f} µs{drv}, {r['footprint']:.2f}×{mv}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device_total": total, "ops": args.ops, "rows": rows}, f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
        marks = {64 * MiB: "o", 1 * GiB: "s", 4 * GiB: "^"}
        for i, name in enumerate(names):
            pts = [r for r in rows if r["allocator"] == name and "cap_fraction" not in r and r.get("finished")]
            for r in pts:
                ax.scatter(r["us_per_op"], r["footprint"], marker=marks[r["max_size"]], color=f"C{i}",
                           label=name if r is pts[0] else None)
        ax.set_xscale("log")
        ax.set_xlabel("µs per operation (warm; log scale)")
        ax.set_ylabel("peak device memory / peak live")
        ax.set_title("random workload: ○ ≤64 MiB  □ ≤1 GiB  △ ≤4 GiB")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot)


if __name__ == "__main__":
    main()
