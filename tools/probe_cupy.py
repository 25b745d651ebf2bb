"""Where the time of cupy.empty through mrkit goes (GPU): CuPy's allocator hooks with more and more of
mrkit's work in them, measured in interleaved rounds (best of each), then a profile. Diagnostic, not a
benchmark of record: ``python tools/probe_cupy.py``."""
import cProfile
import io
import pstats
import time
import weakref

import cupy

import mrkit
import mrkit.cupy
from mrkit import DeviceMemoryResource, PoolResource


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

    # the pool's cache-hit path written into the CuPy hooks (an experiment: what fusing would gain)
    live, states_get, uid = pool._live, pool._states.get, s.uid
    cell = [(lambda: None, s)]
    where = {}

    def m_fused(nb, d):
        cs = gs(d)
        ref, st_ = cell[0]
        if ref() is not cs:
            cell[0] = (weakref.ref(cs), mrkit.as_stream(cs))
            st_ = cell[0][1]
        st = states_get(st_.uid)
        if st is not None:
            lst = st.cache.get((nb + 255) & -256)
            if lst:
                p = lst.pop()
                live[p] = nb
                where[p] = st_
                return p
        p = a(nb, st_)
        where[p] = st_
        return p

    def f_fused(p, d):
        st_ = where.pop(p)
        nb = live.pop(p)
        st = states_get(st_.uid)
        lst = st.cache.get((nb + 255) & -256)
        if lst is None:
            live[p] = nb
            f(p, nb, st_)  # first free of this size: the pool's own path
        else:
            lst.append(p)

    hooks = {
        "cupy default pool": cupy.get_default_memory_pool().malloc,
        "PFA trivial (fixed pointer)": PFA(lambda nb, d: bp, lambda p, d: None).malloc,
        "PFA + get_current_stream": PFA(m_stream, lambda p, d: None).malloc,
        "PFA + mrkit pool, fixed stream": PFA(m_pool, f_pool).malloc,
        "mrkit.cupy.allocator(pool)": mrkit.cupy.allocator(pool),
        "PFA + pool hit path fused (experiment)": PFA(m_fused, f_fused).malloc,
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
