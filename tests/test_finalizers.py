"""A finalizer that frees (or allocates) while its own thread is inside one of the resource's locked
steps: the garbage collector can run at any allocation of a Python object, including inside the
arena's locked miss path, the pool's growth or a driver call, and collect a buffer, a CuPy array or a
tensor in a reference cycle whose finalizer frees memory of the same resource.

Before: the finalizer waited for the lock its own thread held, and the interpreter hung for good (both
builds); with two pools, two threads' finalizers waited for each other's. Now a free never waits for
the lock (design rule 8): it is deferred and applied by the locked steps; an allocation from a
finalizer inside its own pool's step is refused with a RuntimeError (reported as any finalizer's
exception is); a bad free still raises at once. Each test runs on both builds and ends with a
conservation check.

``gc.collect()`` inside the upstream's ``allocate`` (or the driver's map call) stands for the automatic
collection that an allocation of a Python object there may start."""
from __future__ import annotations

import contextlib
import gc
import random
import sys
import threading

import pytest

import mrkit
from mrkit import (Buffer, DeviceMemoryResource, PoolResource, StatisticsAdaptor, VirtualMemoryResource,
                   DEFAULT_STREAM as S)
from mrkit._engine import core_name, python_core
from mrkit.driver import SimDriver

from handouts import HandOuts

MiB = 1 << 20


@pytest.fixture(params=["compiled", "python"])
def build(request):
    if request.param == "python":
        with python_core():
            yield "python"
        return
    if core_name() != "compiled":
        pytest.skip("the compiled core is not built here, or MRKIT_NO_EXTENSIONS is set")
    yield "compiled"


class CollectingUpstream(DeviceMemoryResource):
    """An upstream whose allocations run the garbage collector first (as an allocation there may)."""

    def allocate(self, nbytes, stream, alignment=256):
        gc.collect()
        return super().allocate(nbytes, stream, alignment)


class CollectingDriver:
    """``cuMemMap`` that runs the garbage collector first (mixed into the test's driver class)."""

    def mem_map(self, *args, **kwargs):
        gc.collect()
        return type(self).__mro__[1].mem_map(self, *args, **kwargs)


class Cycle:
    """Garbage in a reference cycle: only the collector frees it, and then runs ``on_del``."""

    def __init__(self, on_del):
        self.me, self.on_del = self, on_del

    def __del__(self):
        self.on_del()


def _in_threads(fns, timeout=20.0):
    """Run each of ``fns`` in a daemon thread; fail (instead of hanging the suite) if one does not
    finish; re-raise the first error; the results."""
    out, err = {}, []

    def body(k, fn):
        try:
            out[k] = fn()
        except BaseException as exc:  # reported below
            err.append(exc)
    ts = [threading.Thread(target=body, args=(k, fn), daemon=True) for k, fn in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert not any(t.is_alive() for t in ts), "deadlocked: a thread waits for a lock it holds itself"
    if err:
        raise err[0]
    return [out[k] for k in range(len(fns))]


def _in_thread(fn, timeout=20.0):
    return _in_threads([fn], timeout)[0]


@contextlib.contextmanager
def _unraisable():
    """The exceptions finalizers reported (``sys.unraisablehook``) while inside."""
    got, old = [], sys.unraisablehook
    sys.unraisablehook = lambda args: got.append(args.exc_value)
    try:
        yield got
    finally:
        sys.unraisablehook = old


def _pool(drv):
    return PoolResource(CollectingUpstream(0, driver=drv)), drv


def _conserved(pool, drv):
    assert pool.live_bytes == 0
    pool.release()
    assert pool.pool_size == 0, "bytes kept after release: a block was lost"
    gc.collect()


@pytest.mark.parametrize("wrap", ["pool", "statistics"])
def test_a_buffer_collected_while_the_pool_grows_is_freed_not_deadlocked(build, backend, wrap):
    pool, drv = _pool(backend)
    mr = pool if wrap == "pool" else StatisticsAdaptor(pool)
    assert pool.arena.build.__name__.endswith("_hotc" if build == "compiled" else "_hot")
    b = Buffer(mr.allocate(3000, S), 3000, mr, S)
    first = b.ptr
    Cycle(b.close)
    del b
    big = _in_thread(lambda: mr.allocate(64 * MiB, S))  # grows: the collector runs, the buffer is freed
    assert pool.arena.deferred == []  # applied at the end of that locked step
    assert pool.live_bytes == 64 * MiB
    assert mr.allocate(3000, S) == first  # the deferred block is back in the free list, reused
    mr.deallocate(first, 3000, S)
    mr.deallocate(big, 64 * MiB, S)
    if wrap == "statistics":
        assert mr.statistics.current_bytes == 0
    _conserved(pool, drv)


def test_an_aligned_block_and_a_hot_size_freed_by_a_finalizer(build, backend):
    pool, drv = _pool(backend)
    aligned = pool.allocate(5000, S, 4096)
    for _ in range(3):  # 1 MiB becomes a hot size: its frees go to the cache
        pool.deallocate(pool.allocate(MiB, S), MiB, S)
    hot = pool.allocate(MiB, S)
    Cycle(lambda: (pool.deallocate(aligned, 5000, S, 4096), pool.deallocate(hot, MiB, S)))
    big = _in_thread(lambda: pool.allocate(256 * MiB, S))
    assert pool.arena.deferred == [] and pool.live_bytes == 256 * MiB
    with pytest.raises(ValueError):
        pool.deallocate(aligned, 5000, S, 4096)  # it was freed: freeing again is an error
    pool.deallocate(big, 256 * MiB, S)
    _conserved(pool, drv)


def test_a_bad_free_in_a_finalizer_raises_at_once_and_changes_nothing(build, backend):
    pool, drv = _pool(backend)
    p = pool.allocate(3000, S)
    pool.deallocate(p, 3000, S)
    keep = pool.allocate(8000, S)
    with _unraisable() as got:
        Cycle(lambda: pool.deallocate(p, 3000, S))  # a double free
        Cycle(lambda: pool.deallocate(keep, 100, S))  # the wrong size
        big = _in_thread(lambda: pool.allocate(64 * MiB, S))
    assert [type(e) for e in got] == [ValueError, ValueError], got
    assert pool.arena.deferred == []
    # nothing changed: keep is live, p is free once (not twice), every byte counted once
    assert pool.live_bytes == 64 * MiB + 8000
    assert pool.arena.free_total() + 64 * MiB + 8192 == pool.pool_size
    a, b = pool.allocate(3000, S), pool.allocate(3000, S)
    assert a != b
    pool.deallocate(a, 3000, S)
    pool.deallocate(b, 3000, S)
    pool.deallocate(keep, 8000, S)
    pool.deallocate(big, 64 * MiB, S)
    _conserved(pool, drv)


def test_an_allocation_in_a_finalizer_is_refused_not_deadlocked(build, backend):
    pool, drv = _pool(backend)
    got_ptr = []
    with _unraisable() as got:
        Cycle(lambda: got_ptr.append(pool.allocate(3000, S)))
        big = _in_thread(lambda: pool.allocate(64 * MiB, S))
    assert got_ptr == [] and len(got) == 1 and isinstance(got[0], RuntimeError)
    assert "locked steps" in str(got[0]) and repr(pool) in str(got[0])
    pool.deallocate(big, 64 * MiB, S)
    _conserved(pool, drv)


def test_the_vmm_maps_while_a_finalizer_frees(build, backend):
    drv = type("Collecting" + type(backend).__name__, (type(backend),), {"mem_map": CollectingDriver.mem_map})()
    vmm = VirtualMemoryResource(0, driver=drv)
    b = Buffer(vmm.allocate(3 * MiB, S), 3 * MiB, vmm, S)
    Cycle(b.close)
    del b
    p = _in_thread(lambda: vmm.allocate(100 * MiB, S))  # maps pages: the collector runs
    assert vmm.arena.deferred == [] and vmm.live_bytes == 100 * MiB
    vmm.deallocate(p, 100 * MiB, S)
    vmm.trim()
    assert vmm.live_bytes == 0 and vmm.mapped_bytes == 0


def test_a_cupy_array_collected_inside_a_miss(build, monkeypatch):
    backend = SimDriver()
    """CuPy frees through mrkit's hooks (C function pointers in the compiled build)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import fake_cupy
    fake = fake_cupy.make()
    for name in ("cupy", "cupy.cuda", "cupy.cuda.memory", "cupy.cuda.device"):
        monkeypatch.setitem(sys.modules, name, fake if name == "cupy" else
                            getattr(fake.cuda, name.rsplit(".", 1)[1]) if name != "cupy.cuda" else fake.cuda)
    import mrkit.cupy as mc
    pool, drv = _pool(backend)
    fn = mc.allocator(pool)
    held = Cycle(lambda: None)
    held.mp = fn(3000)  # the cycle holds the array's memory, freed when the collector clears it
    del held
    big = _in_thread(lambda: fn(64 * MiB))
    assert pool.arena.deferred == [] and pool.live_bytes == 64 * MiB
    del big
    gc.collect()
    _conserved(pool, drv)


def test_threads_with_the_collector_running_inside_locked_steps(build, backend):
    """Four threads allocate and free random sizes while buffers in reference cycles are collected at
    random points, some inside locked steps (the collector runs on most allocations); nothing is
    handed out twice, nothing is lost."""
    pool, drv = _pool(backend)
    handed = HandOuts()
    old = gc.get_threshold()
    gc.set_threshold(5, 1, 1)

    def work(seed):
        rng = random.Random(seed)
        mine = []
        for _ in range(300):
            if mine and rng.random() < 0.45:
                p, n = mine.pop(rng.randrange(len(mine)))
                handed.gave(p)
                if rng.random() < 0.3:  # left to a finalizer in a cycle
                    Cycle(lambda p=p, n=n: pool.deallocate(p, n, S))
                else:
                    pool.deallocate(p, n, S)
            else:
                n = rng.choice((256, 3000, 65536, MiB, 3 * MiB + 5))
                p = pool.allocate(n, S)
                handed.took(p)
                mine.append((p, n))
        for p, n in mine:
            handed.gave(p)
            pool.deallocate(p, n, S)
    try:
        _in_threads([lambda k=k: work(k) for k in range(4)], timeout=60)
    finally:
        gc.set_threshold(*old)
    gc.collect()
    with pool.arena.lock:
        pool.arena.apply_deferred()
    _conserved(pool, drv)


@pytest.mark.gpu
def test_a_real_cupy_array_collected_inside_a_miss_on_the_gpu(build, gpu):
    cupy = pytest.importorskip("cupy")
    import mrkit.cupy as mc
    pool, drv = _pool(gpu)
    old = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(mc.allocator(pool))
    try:
        held = Cycle(lambda: None)
        held.arr = cupy.arange(1000, dtype=cupy.float32)
        first = held.arr.data.ptr
        del held
        big = _in_thread(lambda: cupy.empty(64 * MiB, dtype=cupy.uint8))  # grows; the collector frees arr
        assert pool.arena.deferred == []
        again = cupy.zeros(1000, dtype=cupy.float32)
        assert again.data.ptr == first and float(again.sum()) == 0.0
        del big, again
        cupy.cuda.Device().synchronize()
    finally:
        cupy.cuda.set_allocator(old)
    gc.collect()
    _conserved(pool, drv)


class _MeetingUpstream(DeviceMemoryResource):
    """An upstream whose allocation (under its pool's lock: the pool is growing) waits until the
    other thread is inside its own pool's growth too, then runs ``on_grow`` (a finalizer the collector
    runs there, freeing a buffer of the other pool)."""

    def __init__(self, *args, here, there, **kwargs):
        super().__init__(*args, **kwargs)
        self.here, self.there, self.on_grow = here, there, None

    def allocate(self, nbytes, stream, alignment=256):
        if self.on_grow is not None:
            run, self.on_grow = self.on_grow, None
            self.here.set()
            assert self.there.wait(10), "the other thread never grew its pool"
            run()
        return super().allocate(nbytes, stream, alignment)


def test_two_threads_whose_finalizers_free_into_each_others_locked_pool(build, backend):
    """Thread A grows pool X (X's lock held) while thread B grows pool Y (Y's lock held); in each, a
    finalizer frees a buffer of the other pool. Before: each waited for the lock the other held, for
    good. A free never waits for a lock (rule 8): each is deferred and applied by the holder."""
    a_in, b_in = threading.Event(), threading.Event()
    ux = _MeetingUpstream(0, driver=backend, here=a_in, there=b_in)
    uy = _MeetingUpstream(0, driver=backend, here=b_in, there=a_in)
    x, y = PoolResource(ux), PoolResource(uy)
    bx, by = Buffer(x.allocate(3000, S), 3000, x, S), Buffer(y.allocate(5000, S), 5000, y, S)
    ux.on_grow, uy.on_grow = by.close, bx.close  # X's growth frees Y's buffer, and the other way
    big_x, big_y = _in_threads([lambda: x.allocate(64 * MiB, S), lambda: y.allocate(64 * MiB, S)])
    assert x.live_bytes == y.live_bytes == 64 * MiB
    x.deallocate(big_x, 64 * MiB, S)
    y.deallocate(big_y, 64 * MiB, S)
    _conserved(x, backend)
    _conserved(y, backend)


def test_a_free_that_finds_the_lock_taken_returns_at_once_and_its_block_is_reused(build, backend):
    """Another thread holds the pool's lock: a free of a size that is not cached neither waits nor
    touches the free lists; the next miss on the stream applies it first and reuses the block."""
    pool, drv = _pool(backend)
    p = pool.allocate(3000, S)
    keep = pool.allocate(5000, S)  # p's neighbour stays live: p is a block of its own
    held, go = threading.Event(), threading.Event()

    def holder():
        with pool.arena.lock:
            held.set()
            assert go.wait(10)
    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert held.wait(10)
    _in_thread(lambda: pool.deallocate(p, 3000, S), timeout=5)  # does not wait for the holder
    assert pool.arena.deferred == [(p, 3072, S)] and pool.arena.live_total() == 5000  # read without the lock
    go.set()
    t.join(10)
    assert pool.allocate(3000, S) == p and pool.arena.deferred == []
    pool.deallocate(p, 3000, S)
    pool.deallocate(keep, 5000, S)
    _conserved(pool, drv)
