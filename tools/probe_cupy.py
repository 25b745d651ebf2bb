"""Where the time of cupy.empty through mrkit goes (GPU): CuPy's allocator hooks with more and more of
mrkit's work in them, measured in interleaved rounds (best of each), then a profile. Diagnostic, not a
benchmark of record: ``python tools/probe_cupy.py``."""
import cProfile
import io
import pstats
import time

import cupy

import mrkit
import mrkit.cupy
from mrkit import DeviceMemoryResource, LimitingAdaptor, PoolResource


def loop(n, count):
    empty, u8 = cupy.empty, cupy.uint8
    for _ in range(count):
        empty(n, dtype=u8)


def timed(fn, count=20000):
    t0 = time.perf_counter()
    fn(count)
    return (time.perf_counter() - t0) / count * 1e6


def main(n=256, rounds=5):
    PFA = cupy.cuda.PythonFunctionAllocator
    base = cupy.cuda.alloc(1 << 20)
    bp = base.ptr
    pool = PoolResource(DeviceMemoryResource(0))
    s = mrkit.DEFAULT_STREAM
    gs = cupy.cuda.get_current_stream
    a, f = pool.allocate, pool.deallocate
    sizes = {}

    def m_stream(nb, d):
        gs()
        return bp

    def m_pool(nb, d):
        p = a(nb, s)
        sizes[p] = nb
        return p

    def f_pool(p, d):
        f(p, sizes.pop(p), s)

    hooks = {
        "cupy default pool": cupy.get_default_memory_pool().malloc,
        "PFA trivial (fixed pointer)": PFA(lambda nb, d: bp, lambda p, d: None).malloc,
        "PFA + get_current_stream": PFA(m_stream, lambda p, d: None).malloc,
        "PFA + mrkit pool calls, fixed stream": PFA(m_pool, f_pool).malloc,
        "mrkit.cupy.allocator(pool)": mrkit.cupy.allocator(pool),
        "mrkit.cupy.allocator(any resource)": mrkit.cupy.allocator(LimitingAdaptor(pool, "64 GiB")),
    }
    raw = {
        "get_current_stream() alone": lambda c: [gs() for _ in range(c)],
        "mrkit pool pair alone": lambda c: [f(a(256, s), 256, s) for _ in range(c)],
    }
    best = {}
    for _ in range(rounds):
        for name, h in hooks.items():
            cupy.cuda.set_allocator(h)
            loop(n, 500)
            best[name] = min(best.get(name, 1e9), timed(lambda c: loop(n, c)))
        for name, fn in raw.items():
            best[name] = min(best.get(name, 1e9), timed(fn))
    ref = best["cupy default pool"]
    for k, v in best.items():
        print(f"{k:34s} {v:7.3f} us  {v / ref:5.2f}x of cupy default")
    cupy.cuda.set_allocator(hooks["mrkit.cupy.allocator(pool)"])
    pr = cProfile.Profile()
    pr.enable()
    loop(n, 20000)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(12)
    print(out.getvalue())
    cupy.cuda.set_allocator(hooks["cupy default pool"])


if __name__ == "__main__":
    main()
