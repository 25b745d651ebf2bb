"""Physical footprint on RMM's random-allocation workload: peak physical bytes / peak live bytes.

mrkit's VirtualMemoryResource (pages given back past a release threshold) beside the driver pool,
CuPy's MemoryPool and PyTorch's caching allocator with and without expandable segments, in one run.
Run on a GPU: ``python benchmarks/bench_vmm.py [--ops N]``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

GiB = 1 << 30


def plan(ops, max_size, cap, seed=7):
    rng = random.Random(seed)
    live, out, cur = [], [], 0
    for _ in range(ops):
        n = rng.randint(1, max_size)
        if (rng.random() < 0.5 or not live) and cur + n <= cap:
            out.append(("a", n, len(out)))
            live.append((len(out) - 1, n))
            cur += n
        elif live:
            k, n = live.pop(rng.randrange(len(live)))
            out.append(("f", n, k))
            cur -= n
    return out


def run(alloc, free, physical, steps, passes=2):
    # ``physical`` is the allocator's own high-water mark of physical bytes, read once per pass,
    # so the timing holds no extra query per operation
    """Run the workload ``passes`` times (each pass ends with everything freed). Returns the peak
    physical / peak live ratio over all passes, us/op of the first (cold) pass and of the last
    (warm: the allocator has seen the workload once, as in a training loop's second iteration)."""
    peak_live = peak_phys = 0
    times = []
    sizes = {k: n for kind, n, k in steps if kind == "a"}
    for _ in range(passes):
        handles, cur = {}, 0
        t0 = time.perf_counter()
        for kind, n, k in steps:
            if kind == "a":
                handles[k] = alloc(n)
                cur += n
                peak_live = max(peak_live, cur)
            else:
                free(handles.pop(k), n)
                cur -= n
        times.append((time.perf_counter() - t0) * 1e6 / len(steps))
        peak_phys = max(peak_phys, physical())
        for k, h in list(handles.items()):
            free(h, sizes[k])
    return peak_phys / peak_live, times[0], times[-1]


def _mrkit_run(mr, physical, steps):
    import mrkit
    s = mrkit.DEFAULT_STREAM
    allocate, deallocate = mr.allocate, mr.deallocate
    # one Python call between the workload and the allocator, as for the peers below
    return run(lambda n: allocate(n, s), lambda p, n: deallocate(p, n, s), physical, steps)


def mrkit_vmm(steps, **options):
    import mrkit
    mr = mrkit.VirtualMemoryResource(0, mrkit.VirtualMemoryResourceOptions(reserve_size=256 * GiB, **options))
    r = _mrkit_run(mr, lambda: mr.mapped_high, steps)
    mr.close()
    return r + (mr.moves,)


def mrkit_driver_pool(steps):
    import mrkit
    mr = mrkit.DeviceMemoryResource(0, mrkit.DeviceMemoryResourceOptions())
    r = _mrkit_run(mr, lambda: mr.pool.reserved_mem_high, steps)
    mr.trim()
    mr.close()
    return r


def cupy_pool(steps):
    import cupy
    pool = cupy.cuda.MemoryPool()
    r = run(lambda n: pool.malloc(n), lambda h, n: None, pool.total_bytes, steps)
    pool.free_all_blocks()
    return r


def torch_caching(steps):
    import torch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    ca, cd = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    r = run(lambda n: ca(n), lambda h, n: cd(h), torch.cuda.max_memory_reserved, steps)
    torch.cuda.empty_cache()
    return r


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=600)
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--only-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--max-size", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    ranges = [args.max_size] if args.max_size else [1 * GiB, 4 * GiB]
    rows = {}
    for max_size in ranges:
        steps = plan(args.ops, max_size, cap=48 * GiB)
        if args.only_torch:
            print(json.dumps(torch_caching(steps)))
            return
        label = f"up to {max_size // GiB} GiB"
        r = rows.setdefault(label, {})
        r["mrkit vmm (default: no automatic release)"] = mrkit_vmm(steps)
        r["mrkit vmm (footprint_limit=1.05: moves free pages)"] = mrkit_vmm(steps, footprint_limit=1.05)
        r["mrkit vmm (footprint_limit=1.09, max_mapping=256 MiB)"] = mrkit_vmm(
            steps, footprint_limit=1.09, max_mapping="256 MiB")
        r["mrkit vmm (release past 0)"] = mrkit_vmm(steps, release_threshold=0)
        r["mrkit vmm (release past 10% of live)"] = mrkit_vmm(steps, release_fraction=0.1)
        r["driver pool (mrkit DeviceMemoryResource)"] = mrkit_driver_pool(steps)
        try:
            r["cupy MemoryPool"] = cupy_pool(steps)
        except ImportError:
            pass
        try:
            r["torch caching"] = torch_caching(steps)
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
            out = subprocess.run([sys.executable, __file__, "--only-torch", "--ops", str(args.ops),
                                  "--max-size", str(max_size)], capture_output=True, text=True, env=env, timeout=300)
            r["torch expandable segments"] = tuple(json.loads(out.stdout.strip().splitlines()[-1]))
        except Exception as exc:  # noqa: BLE001
            print("torch:", exc, file=sys.stderr)
    print("| allocator | " + " | ".join(f"{k}: peak physical / peak live | us/op cold | us/op warm | moves"
                                        for k in rows) + " |")
    print("|---" * (1 + 4 * len(rows)) + "|")
    names = list(next(iter(rows.values())))
    for name in names:
        cells = []
        for k in rows:
            v = rows[k].get(name)
            cells.append("- | - | - | -" if v is None else
                         f"{v[0]:.3f}x | {v[1]:.1f} | {v[2]:.1f} | {v[3] if len(v) > 3 else '-'}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
