"""RMM's random workload to 8 MiB (``bench_pool.random_workload``'s loop: 50/50, sizes uniform to 8 MiB,
new sizes each pass) on the simulator, for counting instructions: ``plans`` passes through the pool, the
VMM or a floor of C builtins that do nothing (the loop alone), the first three untimed.

    python tools/probe_random_loop.py {pool,vmm,floor} [plans]

Instructions per operation beyond a fixed start: run it under callgrind with 30 and with 10 plans and
divide the difference of the totals by 200 000 (``valgrind --tool=callgrind --callgrind-out-file=/dev/null
python tools/probe_random_loop.py pool 30``); the floor's count is the loop's and the plans' own."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import mrkit
from mrkit.driver import SimDeviceSpec, SimDriver

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_pool as bp  # noqa: E402


def plan(seed: int, ops: int = 10000) -> list:
    """One pass's steps, made with numpy (a small share of the count beside the allocator's)."""
    r = np.random.default_rng(seed)
    return list(zip((r.random(ops) < 0.5).tolist(), r.integers(1, 8 << 20, ops, endpoint=True).tolist(),
                    r.random(ops).tolist()))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    kind = argv[0] if argv else "pool"
    plans = [plan(s) for s in range(int(argv[1]) if len(argv) > 1 else 60)]
    mrkit.set_backend(SimDriver(devices=[SimDeviceSpec(total_memory=141 << 30)]))
    streams = [mrkit.Stream.create(0) for _ in range(8)]
    if kind == "floor":
        loop = bp._random_loop_explicit({}.get, slice, streams[0])
    else:
        loop = bp.mrkit_peer(kind, streams)[5]
    for p in plans[:3]:
        loop(p)
    t = time.perf_counter()
    for p in plans[3:]:
        loop(p)
    print(f"{kind}: {(time.perf_counter() - t) / max(1, len(plans) - 3) / 1e4 * 1e9:.0f} ns an operation")


if __name__ == "__main__":
    main()
