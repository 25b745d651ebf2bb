"""What any footprint-limited VMM must pay on RMM's random workload: an idealised model, no allocator.

The model keeps the footprint bound (physical memory within ``--limit`` x the live high-water mark)
with the best case a real driver does not allow: physical memory moves page by page (2 MiB), as if a
mapping could be split or mapped at an offset (``cuMemMap``'s offset must be zero today, so a real
VMM moves whole mappings). Placement is best fit among the mapped free ranges; a request that fits
none is a *miss*: it goes where the fewest pages are missing, and those pages come from the smallest
mapped free ranges. Evicting free pages to stay within the bound is free of charge.

A miss needs at least one mapping changed (an unmap, a map and an access call: 37-88 us on the H200,
benchmarks/HISTORY.md), so misses per operation x that cost is a floor on the driver time per
operation of any allocator that keeps the bound, on this plan. It prints, per pass (new sizes each
pass, the plans of ``bench_workload.py``): misses per operation and the pages moved per miss.

    python benchmarks/bench_vmm_floor.py --rules rmm --max-size 1GiB [--limit 1.1] [--passes 3]
"""
from __future__ import annotations

import argparse
import importlib.util
import os

import numpy as np

_spec = importlib.util.spec_from_file_location("bench_workload", os.path.join(os.path.dirname(__file__), "bench_workload.py"))
bench_workload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_workload)

GiB, PAGE = 1 << 30, 2 << 20
FREE, MAPPED, LIVE = 0, 1, 2  # a page of the model's address space: unmapped, mapped and free, live


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (exclusive) of the runs of True in ``mask``."""
    d = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def simulate(steps: list, pages: np.ndarray, where: dict, high: list, limit: float) -> tuple[int, int]:
    """Run one pass's ``steps`` over the page states ``pages`` (kept between passes): ``(misses, pages
    moved)``. ``high`` holds the live high-water mark in pages."""
    misses = moved = 0
    live = int((pages == LIVE).sum())
    for kind, n, key in steps:
        need = -(-n // PAGE)
        if kind == "f":
            at = where.pop(key)
            pages[at:at + need] = MAPPED
            live -= need
            continue
        s, e = _runs(pages == MAPPED)
        fits = np.flatnonzero(e - s >= need)
        if len(fits):
            at = int(s[fits[np.argmin((e - s)[fits])]])
        else:  # a miss: where the fewest pages are missing, at either end of a free range
            misses += 1
            s, e = _runs(pages != LIVE)
            mapped_before = np.concatenate(([0], np.cumsum(pages == MAPPED)))
            best = None
            for a, b in zip(s, e):
                if b - a < need:
                    continue
                for at in (int(a), int(b) - need):
                    missing = need - int(mapped_before[at + need] - mapped_before[at])
                    if best is None or missing < best[0]:
                        best = (missing, at)
            missing, at = best
            moved += missing
        pages[at:at + need] = LIVE
        where[key] = at
        live += need
        high[0] = max(high[0], live)
        over = int((pages != FREE).sum()) - int(limit * high[0])
        if over > 0:  # the bound: unmap free pages, from the smallest mapped free ranges first
            s, e = _runs(pages == MAPPED)
            for i in np.argsort(e - s, kind="stable"):
                take = min(int(e[i] - s[i]), over)
                pages[e[i] - take:e[i]] = FREE
                over -= take
                if over <= 0:
                    break
    return misses, moved


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", choices=("bench", "rmm"), default="rmm")
    ap.add_argument("--max-size", type=bench_workload._size, default=GiB)
    ap.add_argument("--ops", type=bench_workload._positive, default=1000)
    ap.add_argument("--passes", type=bench_workload._positive, default=3)
    ap.add_argument("--limit", type=float, default=1.1)
    args = ap.parse_args(argv)
    if not args.limit >= 1.0:
        ap.error(f"--limit must be >= 1.0, got {args.limit}")
    os.environ["MRKIT_BENCH_RULES"] = args.rules
    cap = 16 * GiB
    pages = np.zeros(int(args.limit * cap * 3) // PAGE, np.int8)  # address space: room for any placement
    where: dict = {}
    high = [0]
    print(f"idealised VMM, footprint limit {args.limit}, {args.rules} rules, sizes up to "
          f"{args.max_size / GiB:g} GiB, page-granular moves")
    for p in range(args.passes):
        steps = bench_workload.plan(args.ops, args.max_size, cap, seed=7 + p)
        misses, moved = simulate(steps, pages, where, high, args.limit)
        print(f"pass {p}: {len(steps)} operations, {misses / len(steps):.3f} misses per operation, "
              f"{moved * PAGE / GiB / max(misses, 1):.2f} GiB moved per miss")
        pages[pages == LIVE] = MAPPED  # the plan frees every block at its end; what it left live goes too
        where.clear()


if __name__ == "__main__":
    main()
