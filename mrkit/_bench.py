"""``mrkit bench``: a resource spec measured beside CuPy's and PyTorch's allocators (where installed
and a GPU is present), in the same process, on the same workload plans.

Each workload is a plan fixed in advance (``("a", size, stream index)`` / ``("f", step of the
allocation)``), run by the same loop for every allocator, so the loop's own cost is shared and the
ratios compare the allocators. Times are medians over rounds, in microseconds per call."""
from __future__ import annotations

import random
import statistics
import time

__all__ = ["WORKLOADS", "workload_plan", "run_bench"]

WORKLOADS = ("pairs", "batch", "random", "streams")


def workload_plan(name: str, ops: int, cap: int, seed: int = 0) -> list[tuple]:
    """The plan of workload ``name`` with about ``ops`` calls, live bytes under ``cap``:

    pairs: allocate and free at once, sizes cycling 256 B / 64 KiB / 1 MiB (the hot path);
    batch: allocate 64 blocks of mixed sizes, then free them all;
    random: log-uniform sizes 256 B .. min(64 MiB, cap / 16), 50/50 allocate/free of a random live block;
    streams: as random, on four streams round-robin (each block freed on its own stream)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {name!r}")
    plan: list[tuple] = []
    if name == "pairs":
        sizes = (256, 64 << 10, 1 << 20)
        for i in range(ops // 2):
            plan.append(("a", sizes[i % 3], 0))
            plan.append(("f", len(plan) - 1, 0))
        return plan
    if name == "batch":
        sizes = [256 << (i % 13) for i in range(64)]
        while len(plan) < ops:
            first = len(plan)
            plan.extend(("a", n, 0) for n in sizes)
            plan.extend(("f", first + k, 0) for k in range(len(sizes)))
        return plan
    top = max(12, min(26, (cap // 16).bit_length() - 1))
    return random_plan(ops, top, cap, streams=4 if name == "streams" else 1, seed=seed, drain=True)


def random_plan(ops: int, top_bits: int, cap: int, *, streams: int = 1, p_free: float = 0.5,
                seed: int = 0, drain: bool = False) -> list[tuple]:
    """``ops`` steps: log-uniform sizes from 256 B to ``2**top_bits``, stream ``i % streams``; a random
    live block freed with probability ``p_free`` (or when the next size would pass ``cap``); with
    ``drain``, every block still live is freed at the end."""
    rng = random.Random(seed)
    plan: list[tuple] = []
    live: list[int] = []
    used = 0
    for i in range(ops):
        n = int(2 ** rng.uniform(8, top_bits))
        if live and (rng.random() < p_free or used + n > cap):
            k = live.pop(rng.randrange(len(live)))
            used -= plan[k][1]
            plan.append(("f", k, 0))
        else:
            live.append(len(plan))
            used += n
            plan.append(("a", n, i % streams))
    if drain:
        plan.extend(("f", k, 0) for k in live)
    return plan


def _run(plan, alloc, free, streams) -> float:
    """Seconds to run ``plan`` with ``alloc(nbytes, stream) -> handle`` and ``free(handle, nbytes, stream)``."""
    handles: dict[int, object] = {}
    clock = time.perf_counter
    t0 = clock()
    for i, (kind, a, b) in enumerate(plan):
        if kind == "a":
            handles[i] = alloc(a, streams[b])
        else:
            _, n, sidx = plan[a]
            free(handles.pop(a), n, streams[sidx])
    return clock() - t0


def _mrkit_allocator(spec: str, drv):
    from ._spec import resource_from_spec
    from ._stream import Stream
    mr = resource_from_spec(spec, drv)
    from ._stream import DEFAULT_STREAM
    # stream 0 is the default stream for every allocator; 1..3 are streams of their own
    streams = [DEFAULT_STREAM] + [Stream.create(mr.device_id or 0, driver=drv) if mr.device_accessible
                                  else DEFAULT_STREAM for _ in range(3)]

    def close():
        for s in streams:
            if s is not DEFAULT_STREAM:
                s.synchronize()
                s.close()
        for name in ("release", "close"):
            fn = getattr(mr, name, None)
            if callable(fn):
                try:
                    fn()
                except Exception:  # noqa: BLE001 - a resource without one of them
                    pass
    return mr.allocate, lambda p, n, s: mr.deallocate(p, n, s), streams, close


def _cupy_allocator():
    import cupy
    pool = cupy.cuda.MemoryPool()
    streams = [None] + [cupy.cuda.Stream(non_blocking=True) for _ in range(3)]
    malloc = pool.malloc

    def alloc(n, s):
        if s is None:
            return malloc(n)
        with s:  # switching CuPy's current stream: what a CuPy program on several streams pays too
            return malloc(n)

    def free(mp, n, s):
        del mp  # CuPy frees when the last reference goes (on the stream it was allocated on)

    def close():
        pool.free_all_blocks()
    return alloc, free, streams, close


def _torch_allocator():
    import torch
    streams = [None] + [torch.cuda.Stream() for _ in range(3)]
    dev = torch.cuda.current_device()
    alloc_fn, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

    def alloc(n, s):
        return alloc_fn(n, dev, s)

    def free(p, n, s):
        delete(p)

    def close():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return alloc, free, streams, close


def _others(drv) -> dict:
    """CuPy's MemoryPool and PyTorch's caching allocator, where importable and on a GPU."""
    found = {}
    if drv.name != "cuda":
        return found
    try:
        import cupy  # noqa: F401
        found["cupy MemoryPool"] = _cupy_allocator
    except ImportError:
        pass
    try:
        import torch
        if torch.cuda.is_available():
            found["torch caching allocator"] = _torch_allocator
    except ImportError:
        pass
    return found


def run_bench(spec: str, workloads, drv, *, ops: int = 20_000, rounds: int = 3, advance=None) -> dict:
    """Measure ``spec`` and the others on each workload: ``{"allocators": [...], "workloads":
    {name: {allocator: us_per_call}}, "ratios": {name: {other: mrkit / other}}, ...}``.
    Rounds alternate the allocators (so drift hits all alike); the median round is reported."""
    free_bytes = drv.mem_get_info(0)[0]
    cap = max(64 << 20, min(free_bytes // 4, 16 << 30))
    makers = {f"mrkit {spec}": lambda: _mrkit_allocator(spec, drv), **_others(drv)}
    result = {"spec": spec, "backend": drv.name, "device": drv.device_name(0), "ops": ops, "rounds": rounds,
              "allocators": list(makers), "workloads": {}, "ratios": {}}
    for w in workloads:
        plan = workload_plan(w, ops, cap)
        samples: dict[str, list[float]] = {k: [] for k in makers}
        built = {k: make() for k, make in makers.items()}
        try:
            for name, (alloc, free, streams, _) in built.items():  # warm: pools grow once
                _run(plan, alloc, free, streams)
            for _ in range(rounds):
                for name, (alloc, free, streams, _) in built.items():
                    samples[name].append(_run(plan, alloc, free, streams) * 1e6 / len(plan))
                    if advance is not None:
                        advance(1)
        finally:
            for _, _, _, close in built.values():
                close()
        us = {k: statistics.median(v) for k, v in samples.items()}
        result["workloads"][w] = us
        mine = us[f"mrkit {spec}"]
        result["ratios"][w] = {k: mine / v for k, v in us.items() if not k.startswith("mrkit ") and v > 0}
    return result
