"""Where the time of ``cupy.empty`` through mrkit goes, beside CuPy's own pool and beside the floor of
any allocator CuPy can be given.

The floor is CuPy's ``CFunctionAllocator`` over two C functions that do nothing (``malloc`` returns
one fixed device address, ``free`` returns): what ``cupy.empty`` costs through any allocator hook
before the allocator does any work. The rows, microseconds per ``cupy.empty`` + drop (256 B; and per array
of a batch of 1 000 sizes, all made then dropped in random order, as ``bench_core.py``), best of
``--rounds`` (the rounds interleave the allocators: the GPU machine's CPU speed drifts):

* ``cupy pool``: CuPy's default ``MemoryPool`` (its allocator's own fast path, no hook);
* ``floor (C hook)``: the do-nothing C functions, with ``mrkit.cupy``'s 512-byte rounding in front;
* ``floor (C hook, no rounding)``: the do-nothing C functions called directly;
* ``floor (C hook, distinct addresses)``: the same, but each allocation a different address (the
  next of 2 048 slots 512 bytes apart in one 1 MiB allocation), as a real allocator hands out;
* ``mrkit``: ``mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))``;
* ``mrkit, stream read at C speed``: the same, its hooks reading CuPy's current stream through a
  ``dict.get`` of the stream current when it was made (a diagnostic: what CuPy's
  ``get_current_stream`` costs inside ``cupy.empty``; valid only while the current stream stays);
* ``lean C allocator`` (with mrkit's rounding in front) and ``lean C allocator, no rounding``: the least
  a caching allocator can do in a hook, written in C (sizes rounded to 256 bytes, per-size stacks of
  addresses found through an open-addressed table, a table of live addresses; addresses carved from one
  2 GiB device allocation). No streams, no threads, no checks, no statistics: not an allocator anyone
  should use, but what any allocator CuPy calls through a hook pays at least. Where it reads above a
  target, that target is out of reach of every design;
* ``lean C allocator by CuPy's current stream`` (mrkit's rounding in front): the same, but each
  allocation asks CuPy for its current stream (``get_current_stream(device_id)``, as mrkit's hooks do)
  and the stacks are per stream and size, each live block remembering its stream: the least a
  stream-ordered allocator behind CuPy's hook pays (built against Python's headers; left out where
  they are missing);

and the parts of mrkit's hook, called from Python: the hook pair (``malloc`` + ``free`` of the pool's
hot path; and over the batch of 1 000 sizes), ``cupy.cuda.get_current_stream(0)``, ``cupy.cuda.device.get_device_id()``.

    python benchmarks/bench_cupy_route.py [--json out.json]

Needs a GPU, CuPy and a C compiler (``cc``) for the floor's and the lean allocator's C functions.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_FLOOR_C = r"""
void *floor_malloc(void *param, unsigned long nbytes, int device) { return *(void **)param; }
void floor_free(void *param, void *ptr, int device) { }
/* distinct addresses, as a real allocator hands out: the next of 2048 slots of 512 bytes */
static unsigned long floor_next = 0;
void *floor_distinct_malloc(void *param, unsigned long nbytes, int device) {
    return (char *)*(void **)param + 512 * (floor_next++ & 2047);
}
"""

#: The lean allocator (``lean_init(base, size)``, ``lean_malloc``, ``lean_free``), C source;
#: ``tools/probe_c_hooks.py`` times the same one from C. Built with ``-DLEAN_STREAM=1`` (against
#: Python's headers, see :func:`_compile`), it is keyed by CuPy's current stream as well: each allocation
#: calls the getter ``lean_set_getter`` gave it with the device id (CuPy's ``get_current_stream``, as
#: mrkit's hooks do), and each live block keeps its stream.
LEAN_C = r"""
/* the lean allocator: per-(stream, size) stacks of addresses (an open-addressed table), a live table of
   address -> size (and stream), addresses carved from one device allocation (lean_init); no threads */
#include <stdlib.h>
#ifndef LEAN_STREAM
#define LEAN_STREAM 0
#endif
#if LEAN_STREAM
#include <Python.h>
static PyObject *lean_getter;
void lean_set_getter(PyObject *getter) { Py_INCREF(getter); lean_getter = getter; }
static unsigned long lean_strm[1 << 16];
#define LEAN_SLOTS 8192
#define LEAN_STREAM_FIELD unsigned long stream;
#define LEAN_SAME(e, st, sz) ((e).size == (sz) && (e).stream == (st))
#else  /* one stream: no stream kept anywhere, the table as small as the sizes need */
#define LEAN_SLOTS 4096
#define LEAN_STREAM_FIELD
#define LEAN_SAME(e, st, sz) ((e).size == (sz))
#endif
typedef struct { LEAN_STREAM_FIELD unsigned long size; unsigned long *items; long n, cap; } lean_stack;
static lean_stack lean_sizes[LEAN_SLOTS];
static unsigned long lean_keys[1 << 16], lean_vals[1 << 16], lean_next, lean_end;
static inline unsigned long lean_hash(unsigned long x) { x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; return x ^ (x >> 33); }
void lean_init(unsigned long base, unsigned long size) { lean_next = base; lean_end = base + size; }
static lean_stack *lean_stack_for(unsigned long stream, unsigned long size) {
    unsigned long i = lean_hash(size ^ (stream * 0x9E3779B97F4A7C15UL)) & (LEAN_SLOTS - 1);
    while (lean_sizes[i].size && !LEAN_SAME(lean_sizes[i], stream, size)) i = (i + 1) & (LEAN_SLOTS - 1);
    if (!lean_sizes[i].size) {
        lean_sizes[i].size = size; lean_sizes[i].cap = 16; lean_sizes[i].items = malloc(16 * 8);
#if LEAN_STREAM
        lean_sizes[i].stream = stream;
#endif
    }
    return &lean_sizes[i];
}
void *lean_malloc(void *param, unsigned long n, int device) {
    unsigned long size = (n + 255) & ~255UL, p, i, stream = 0;
#if LEAN_STREAM
    PyObject *dev = PyLong_FromLong(device), *s;
    if (!dev) return 0;
    s = PyObject_CallOneArg(lean_getter, dev);
    Py_DECREF(dev);
    if (!s) return 0;
    stream = (unsigned long)s;  /* CuPy keeps its current stream object alive */
    Py_DECREF(s);
#endif
    lean_stack *st = lean_stack_for(stream, size);
    if (st->n) p = st->items[--st->n];
    else { if (lean_next + size > lean_end) return 0; p = lean_next; lean_next += size; }
    for (i = lean_hash(p) & 65535; lean_keys[i] > 1; i = (i + 1) & 65535) ;
    lean_keys[i] = p; lean_vals[i] = size;
#if LEAN_STREAM
    lean_strm[i] = stream;
#endif
    return (void *)p;
}
void lean_free(void *param, void *ptr, int device) {
    unsigned long p = (unsigned long)ptr, size = 0, stream = 0, i;
    for (i = lean_hash(p) & 65535; lean_keys[i]; i = (i + 1) & 65535)
        if (lean_keys[i] == p) {
            lean_keys[i] = 1; size = lean_vals[i];
#if LEAN_STREAM
            stream = lean_strm[i];
#endif
            break;
        }
    lean_stack *st = lean_stack_for(stream, size);
    if (st->n == st->cap) { st->cap *= 2; st->items = realloc(st->items, st->cap * 8); }
    st->items[st->n++] = p;
}
"""


def _compile(source: str, *flags: str, dll=ctypes.CDLL):
    """``source`` built as a shared library with ``cc -O2`` and ``flags``, loaded as ``dll``; None, with
    the compiler's complaint on stderr, where it does not build."""
    d = tempfile.mkdtemp()
    src, lib = os.path.join(d, "lib.c"), os.path.join(d, "lib.so")
    Path(src).write_text(source)
    r = subprocess.run(["cc", "-O2", "-shared", "-fPIC", *flags, src, "-o", lib], capture_output=True, text=True)
    if r.returncode:
        print(f"(could not build {flags or ''}: {r.stderr.strip()[:200]})", file=sys.stderr)
        return None
    return dll(lib)


def _lean_stream_library():
    """The stream-keyed lean allocator (the hooks run with the GIL: loaded into the process as a
    ``PyDLL``), or None where it cannot be built (no Python headers)."""
    import sysconfig
    return _compile(LEAN_C, "-DLEAN_STREAM=1", f"-I{sysconfig.get_paths()['include']}", dll=ctypes.PyDLL)


def _floor_library():
    lib = _compile(_FLOOR_C + LEAN_C)
    if lib is None:
        raise SystemExit("bench_cupy_route.py needs a C compiler (cc) for the floor's functions")
    return lib


def _per_call(fn, count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(count)
        best = min(best, (time.perf_counter() - t0) / count * 1e6)
    return best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import cupy
    import mrkit.cupy
    from mrkit import DeviceMemoryResource, PoolResource
    from mrkit._engine import core_description, rounding_call

    lib = _floor_library()
    base = cupy.cuda.runtime.malloc(1 << 20)
    cell = ctypes.c_void_p(base)
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    floor = cupy.cuda.memory.CFunctionAllocator(ctypes.addressof(cell), addr(lib.floor_malloc),
                                                addr(lib.floor_free), (lib, cell))
    distinct = cupy.cuda.memory.CFunctionAllocator(ctypes.addressof(cell), addr(lib.floor_distinct_malloc),
                                                   addr(lib.floor_free), (lib, cell))
    lean_base = cupy.cuda.runtime.malloc(2 << 30)
    lib.lean_init(ctypes.c_ulong(lean_base), ctypes.c_ulong(2 << 30))
    lean = cupy.cuda.memory.CFunctionAllocator(0, addr(lib.lean_malloc), addr(lib.lean_free), lib)
    slib = _lean_stream_library()
    if slib is not None:
        lean_stream_base = cupy.cuda.runtime.malloc(2 << 30)
        slib.lean_set_getter.argtypes = [ctypes.py_object]
        slib.lean_set_getter(cupy.cuda.get_current_stream)
        slib.lean_init(ctypes.c_ulong(lean_stream_base), ctypes.c_ulong(2 << 30))
        lean_stream = cupy.cuda.memory.CFunctionAllocator(0, addr(slib.lean_malloc), addr(slib.lean_free), slib)

    def with_rounding(inner):
        r = rounding_call(inner, 512)
        if r is None:  # the Python build has no compiled rounding: the same in Python
            r = lambda size: inner((size + 511) & -512)  # noqa: E731
        return r
    rounded = with_rounding(floor.malloc)
    mine = mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))
    gcs_real = cupy.cuda.get_current_stream
    cupy.cuda.get_current_stream = {0: gcs_real(0)}.get  # read by allocator() once, for its hooks
    try:
        c_speed = mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))  # its hooks made here
    finally:
        cupy.cuda.get_current_stream = gcs_real
    allocators = {"cupy pool": cupy.get_default_memory_pool().malloc, "floor (C hook)": rounded,
                  "floor (C hook, no rounding)": floor.malloc,
                  "floor (C hook, distinct addresses)": distinct.malloc, "mrkit": mine,
                  "mrkit, stream read at C speed": c_speed, "lean C allocator": with_rounding(lean.malloc),
                  "lean C allocator, no rounding": lean.malloc}
    if slib is not None:
        allocators["lean C allocator by CuPy's current stream"] = with_rounding(lean_stream.malloc)
    empty, u8 = cupy.empty, cupy.uint8

    def pairs(count):
        for _ in range(count):
            a = empty(256, dtype=u8)
            del a
    import random
    rng = random.Random(0)
    sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]  # bench_core's batch
    order = list(range(1000))
    rng.shuffle(order)

    def batches(count):
        for _ in range(count // len(sizes)):
            arrs = [empty(n, dtype=u8) for n in sizes]
            for i in order:
                arrs[i] = None
    rows = {name: float("inf") for name in allocators}
    batch_rows = dict(rows)
    arena = mine.resource_for(0).arena
    for name, fn in allocators.items():  # warm up: every size hot in mrkit's pool (from the fourth pass)
        cupy.cuda.set_allocator(fn)
        pairs(1000)
        batches(5000)
    before = arena.misses
    for _ in range(args.rounds):  # rounds interleaved, best of each: the host's speed drifts
        for name, fn in allocators.items():
            cupy.cuda.set_allocator(fn)
            rows[name] = min(rows[name], _per_call(pairs, args.count, 1))
            batch_rows[name] = min(batch_rows[name], _per_call(batches, max(args.count // 2, 2000), 1))
    # the pool's cache misses during the timed runs (0 once every size is hot)
    misses = {"timed": arena.misses - before, "hot sizes": sum(len(st.hot) for st in arena.states.values())}
    cupy.cuda.set_allocator(allocators["cupy pool"])

    hook_malloc, hook_free, _, _ = mine.hooks.hooks(0)

    def hook_pairs(count):
        for _ in range(count):
            hook_free(hook_malloc(512, 0), 0)
    rounded_sizes = [(n + 511) & -512 for n in sizes]

    def hook_batches(count):
        for _ in range(count // len(sizes)):
            ptrs = [hook_malloc(n, 0) for n in rounded_sizes]
            for i in order:
                hook_free(ptrs[i], 0)
    gcs, gdi = cupy.cuda.get_current_stream, cupy.cuda.device.get_device_id

    def stream_calls(count):
        for _ in range(count):
            gcs(0)

    def device_calls(count):
        for _ in range(count):
            gdi()

    def empty_loop(count):
        for _ in range(count):
            pass
    loop = _per_call(empty_loop, args.count, args.rounds)
    hook_batches(3000)
    parts = {"hook pair (Python call)": _per_call(hook_pairs, args.count, args.rounds) - loop,
             "hook batch, per block (Python call)": _per_call(hook_batches, max(args.count // 2, 2000), args.rounds),
             "get_current_stream(0)": _per_call(stream_calls, args.count, args.rounds) - loop,
             "get_device_id()": _per_call(device_calls, args.count, args.rounds) - loop}
    res = {"core": core_description(), "cupy": cupy.__version__, "empty pair 256 (us)": rows,
           "empty batch of 1000 sizes, per array (us)": batch_rows,
           "parts (us, loop subtracted)": parts, "mrkit pool misses": misses,
           "ratios to cupy pool": {k: v / rows["cupy pool"] for k, v in rows.items()},
           "batch ratios to cupy pool": {k: v / batch_rows["cupy pool"] for k, v in batch_rows.items()}}
    print(json.dumps(res, indent=1))
    cupy.cuda.runtime.free(base)
    cupy.cuda.runtime.free(lean_base)
    if slib is not None:
        cupy.cuda.runtime.free(lean_stream_base)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
