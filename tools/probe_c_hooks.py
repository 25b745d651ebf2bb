"""The compiled CuPy hooks timed from C, without a GPU (the simulator and a fake CuPy): the hook pair
(malloc + free of one size) and a batch of 1 000 sizes made then freed in random order, as
``bench_cupy_route.py`` does through ``cupy.empty``; nanoseconds per pair, best of ``rounds``.
Diagnostic for the development machine: ``python tools/probe_c_hooks.py [rounds] [batch]`` (``batch`` or
``pair``: that row only, for a profiler).

``python tools/probe_c_hooks.py [rounds] disturbed`` times the batch's hook calls alone (a clock read
around each) with 0 to 4 MiB of other memory written between calls, as ``cupy.empty``'s own work
evicts the hooks' code and data from the caches, beside C functions that do nothing (the floor) and a
model of a lean hit path over C data (``bench_cupy_route.py``'s lean allocator: per-size stacks of
addresses, a live table; no streams or threads)."""
import ctypes
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fake_cupy  # noqa: E402
from bench_cupy_route import LEAN_C, _compile  # noqa: E402  (the model: bench_cupy_route.py's lean allocator)

cp = fake_cupy.install()
cp.cuda.get_current_stream = {0: cp.Stream(0)}.get  # one stream object per device, read at C speed (as CuPy's)
import mrkit  # noqa: E402
import mrkit.cupy  # noqa: E402
from mrkit import DeviceMemoryResource, PoolResource  # noqa: E402
from mrkit.integrations.cupy import _c_kept  # noqa: E402

_C = r"""
typedef void *(*m_t)(void *, unsigned long, int);
typedef void (*f_t)(void *, void *, int);
#include <time.h>
static char other[1 << 23];
static void disturb(long n) { for (long i = 0; i < n; i += 64) other[i]++; }
static inline long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec; }
void *nothing_malloc(void *param, unsigned long n, int d) { return (void *)(0x7f0000000000UL + n); }
void nothing_free(void *param, void *p, int d) { }
long timed_batch(void *param, m_t m, f_t f, unsigned long *sizes, long *order, void **ptrs, long n, long bytes) {
    long ns = 0;
    for (long i = 0; i < n; i++) { disturb(bytes); long t = now(); ptrs[i] = m(param, sizes[i], 0); ns += now() - t; if (!ptrs[i]) return -1; }
    for (long i = 0; i < n; i++) { disturb(bytes); long t = now(); f(param, ptrs[order[i]], 0); ns += now() - t; }
    return ns;
}
void pairs(void *param, m_t m, f_t f, unsigned long n, long count) {
    for (long i = 0; i < count; i++) { void *p = m(param, n, 0); f(param, p, 0); }
}
int batch(void *param, m_t m, f_t f, unsigned long *sizes, long *order, void **ptrs, long n) {
    for (long i = 0; i < n; i++) { ptrs[i] = m(param, sizes[i], 0); if (!ptrs[i]) return -1; }
    for (long i = 0; i < n; i++) f(param, ptrs[order[i]], 0);
    return 0;
}
"""


def main(rounds=7, only=""):
    lib = _compile(_C + LEAN_C, dll=ctypes.PyDLL)  # the GIL stays held, as CuPy calls the hooks
    if lib is None:
        raise SystemExit("the probe needs a C compiler (cc)")
    lib.pairs.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_ulong, ctypes.c_long]
    lib.batch.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long]
    lib.timed_batch.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long] * 2
    lib.timed_batch.restype = ctypes.c_long
    mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))  # its C hooks stay in _c_kept
    param, m, f = _c_kept[-1][0].addresses
    rng = random.Random(7)
    n = 1000
    sizes = (ctypes.c_ulong * n)(*[(int(2 ** rng.uniform(8, 20)) + 511) & -512 for _ in range(n)])
    order = list(range(n))
    rng.shuffle(order)
    order = (ctypes.c_long * n)(*order)
    ptrs = (ctypes.c_void_p * n)()
    if only == "disturbed":
        floor = [ctypes.cast(fn, ctypes.c_void_p).value for fn in (lib.nothing_malloc, lib.nothing_free)]
        lib.lean_init(ctypes.c_ulong(0x7F0000000000), ctypes.c_ulong(1 << 40))  # addresses never touched
        model = [ctypes.cast(fn, ctypes.c_void_p).value for fn in (lib.lean_malloc, lib.lean_free)]
        for bytes_ in (0, 8 << 10, 48 << 10, 256 << 10, 4 << 20):
            best = {}
            for r in range(rounds):
                for name, (pp, mm, ff) in (("floor", (0, *floor)), ("mrkit", (param, m, f)), ("model", (0, *model))):
                    ns = lib.timed_batch(pp, mm, ff, sizes, order, ptrs, n, bytes_)
                    assert ns >= 0
                    best[name] = min(best.get(name, ns), ns)
            print(f"{bytes_ >> 10:>5} KiB written between calls: floor {best['floor'] / n:.0f} ns, "
                  f"mrkit {best['mrkit'] / n:.0f} ns, a model hit path in C {best['model'] / n:.0f} ns a pair")
        return
    out = {}
    for r in range(rounds + 2):  # two rounds to warm (sizes hot)
        for name, size in () if only == "batch" else (("pair 256 B", 512),) if only == "pair" else (
                ("pair 256 B", 512), ("pair 8 MiB", 8 << 20)):
            t = time.perf_counter()
            lib.pairs(param, m, f, size, 20000)
            out.setdefault(name, []).append((time.perf_counter() - t) / 20000 * 1e9)
        if only == "pair":
            continue
        t = time.perf_counter()
        for _ in range(20):
            assert lib.batch(param, m, f, sizes, order, ptrs, n) == 0
        out.setdefault("batch", []).append((time.perf_counter() - t) / 20 / n * 1e9)
    for k, v in out.items():
        print(f"{k}: {min(v[2:]):.0f} ns a pair")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7, *sys.argv[2:3])
