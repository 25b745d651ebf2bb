"""Fragmentation: RMM's random workload with 95 % of a device live. A caching allocator that splits
blocks carelessly runs out of memory while plenty is free; mrkit's pool (best fit over every free
block) and its VMM (physical pages moved where they are needed) finish, twice over (the second pass
runs on a warm, already fragmented allocator). On a simulated device the size of an H200 (pages are
not backed by host memory), so the result is the same everywhere: this exact sequence ran mrkit's pool
out of memory on the H200 before the fix (see docs/benchmarks.md)."""
import random

import mrkit
from mrkit.driver import SimDeviceSpec, SimDriver

GiB, MiB = 1 << 30, 1 << 20
TOTAL = 150_109_880_320  # an H200's 139.8 GiB
drv = SimDriver([SimDeviceSpec(total_memory=TOTAL - 600 * MiB)], policy="eager")  # less the context


def plan(ops, max_size, cap, seed=7):
    """Sizes uniform in [1, max_size]; grow to the cap, then free a random live block or allocate."""
    rng, steps, live, cur, filling = random.Random(seed), [], [], 0, True
    while len(steps) < ops:
        n = rng.randint(1, max_size)
        filling = filling and cur + n <= cap
        if live and not filling and (rng.random() < 0.5 or cur + n > cap):
            k, m = live.pop(rng.randrange(len(live)))
            steps.append(("f", k, m))
            cur -= m
        elif cur + n <= cap:
            live.append((len(steps), n))
            steps.append(("a", len(steps), n))
            cur += n
    return steps


def run(mr, steps, holding, passes=2):
    """Run ``steps`` ``passes`` times; returns the live peak and the most ``holding()`` ever was."""
    s, peak, most = mrkit.DEFAULT_STREAM, 0, 0
    for _ in range(passes):
        held, cur = {}, 0
        for kind, k, n in steps:
            if kind == "a":
                held[k] = (mr.allocate(n, s), n)
                cur += n
                peak, most = max(peak, cur), max(most, holding())
            else:
                mr.deallocate(held.pop(k)[0], n, s)
                cur -= n
        for p, n in held.values():
            mr.deallocate(p, n, s)
    return peak, most


steps = plan(1000, 1 * GiB, int(0.95 * TOTAL))
results = {}
for name, make in (
        ("pool over cuMemAlloc", lambda: mrkit.PoolResource(mrkit.CudaMemoryResource(0, driver=drv))),
        ("VMM, footprint_limit=1.1", lambda: mrkit.VirtualMemoryResource(
            0, mrkit.VirtualMemoryResourceOptions(footprint_limit=1.1), driver=drv))):
    mr = make()
    holding = (lambda: mr.pool_size) if isinstance(mr, mrkit.PoolResource) else (lambda: mr.physical_bytes)
    peak, held = run(mr, steps, holding)  # raises mrkit.OutOfMemoryError if fragmentation wins
    results[name] = held / peak
    assert mr.live_bytes == 0
    mr.close()
    assert drv.mem_get_info(0)[0] == TOTAL - 600 * MiB  # every byte back to the device
    extra = f", {mr.moves} page moves" if hasattr(mr, "moves") else ""
    print(f"{name}: finished both passes at 95 % of the device; held {held / peak:.3f}x the live peak{extra}")
assert results["VMM, footprint_limit=1.1"] <= 1.1 + 1e-9
