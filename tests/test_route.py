"""The Python build's one-frame allocator route (``hot_paths(mr, "route")``, what CuPy calls in that
build): rounding, the caller's stream, the cache, the memory object whose finalizer frees, another device, bad
sizes, interpreter exit, and threads racing release() with every byte back upstream at the end."""
from __future__ import annotations

import gc
import random
import sys
import threading
import weakref

import pytest

from mrkit import (CudaMemoryResource, DEFAULT_STREAM, PoolResource, Stream, VirtualMemoryResource,
                   VirtualMemoryResourceOptions, as_stream)
from mrkit._engine import hot_paths, python_core
from mrkit.driver import SimDeviceSpec, SimDriver

from handouts import HandOuts, race


class Memory:  # CuPy's UnownedMemory(ptr, size, owner, device_id), as far as the route uses it
    def __init__(self, ptr, size, owner, device_id):
        self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


class Pointer:  # CuPy's MemoryPointer(mem, offset)
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


def _route(mr, *, device=0, current=None, elsewhere=None, exiting=None, late=None):
    """A route over ``mr`` whose caller's current stream is ``current[0]`` (a mrkit Stream)."""
    current = current if current is not None else [DEFAULT_STREAM]
    seen = [(lambda: None, DEFAULT_STREAM)]

    def remember(cs):
        s = as_stream(cs)
        seen[0] = (weakref.ref(cs), s)
        return s
    return hot_paths(mr, "route", device_id=device, get_device=lambda: current[1] if len(current) > 1 else device,
                     elsewhere=elsewhere or (lambda size, dev: ("elsewhere", size, dev)),
                     current_stream=lambda dev: current[0], seen=seen, remember=remember,
                     memory=Memory, pointer=Pointer, unit=512,
                     exiting=exiting if exiting is not None else [False], late=late if late is not None else [0, 0])


def _pool(total=1 << 30):
    drv = SimDriver([SimDeviceSpec(total_memory=total)])
    with python_core():  # the route is the Python build's (the compiled build has CuPy's C route)
        pool = PoolResource(CudaMemoryResource(driver=drv))
    return drv, pool


def _device_bytes(drv):
    return sum(s for _, s, k in drv.regions() if k == "device")


def test_the_route_rounds_serves_the_current_stream_and_its_memory_frees():
    drv, pool = _pool()
    s = Stream.create(driver=drv)
    current = [DEFAULT_STREAM]
    route = _route(pool, current=current)
    assert route.rounding == 512
    a = route(1000)
    assert (a.mem.size, a.mem.device_id, a.ptr) == (1024, 0, a.mem.ptr) and a.ptr % 256 == 0
    mem = a.mem  # a subclass of the caller's memory type whose finalizer frees; its owner is the stream
    assert isinstance(mem, Memory) and type(mem) is not Memory
    assert mem._owner is DEFAULT_STREAM and pool.arena.live == {a.ptr: 1024}
    current[0] = s
    b = route(1)
    assert b.mem.size == 512 and b.mem._owner is s and pool.live_bytes == 1536
    pa, pb = a.ptr, b.ptr
    del a, b
    assert pool.live_bytes == 1024  # the test still holds a's memory: the block stays live
    del mem
    assert pool.live_bytes == 0 and pool.arena.live == {}
    current[0] = DEFAULT_STREAM
    for _ in range(3):  # a repeated size becomes hot and comes back from the stream's cache
        c = route(1000)
        assert c.ptr == pa
        del c
    current[0] = s
    d = route(512)
    assert d.ptr == pb  # each stream gets back what was freed on it
    del d
    pool.release()
    assert pool.pool_size == 0 and _device_bytes(drv) == 0
    s.close()


def test_the_route_answers_zero_bad_sizes_and_another_device_without_changing_state():
    drv, pool = _pool()
    route = _route(pool)
    z = route(0)
    assert (z.ptr, z.mem.size, z.mem._owner) == (0, 0, None) and pool.live_bytes == 0
    with pytest.raises(ValueError, match="size"):  # every bad size: the next test
        route(-4096)
    assert pool.live_bytes == 0 and pool.arena.live == {} and pool.pool_size == 0
    current = [DEFAULT_STREAM, 3]  # the caller's current device is 3
    other = _route(pool, current=current)
    assert other(100) == ("elsewhere", 100, 3) and pool.live_bytes == 0
    for unit in (384, 0, None, 512.0, 128, 64):  # a power of two below the arena's 256 among them
        with pytest.raises(ValueError, match="unit"):
            hot_paths(pool, "route", device_id=0, get_device=int, elsewhere=None, current_stream=None, seen=[None],
                      remember=None, memory=Memory, pointer=Pointer, unit=unit, exiting=[False], late=[0, 0])
    with pytest.raises(ValueError, match="'route'"):
        hot_paths(pool, "routes")


def test_the_compiled_build_has_no_route(sim):
    from mrkit._engine import core_name
    pool = PoolResource(CudaMemoryResource())
    if core_name() == "compiled":
        assert hot_paths(pool, "route") is None  # CuPy takes the C hooks there
    else:
        assert callable(_route(pool))


def test_frees_at_interpreter_exit_are_counted_and_a_failing_one_is_not_reported(monkeypatch):
    drv, pool = _pool()
    exiting, late = [False], [0, 0]
    route = _route(pool, exiting=exiting, late=late)
    a, b = route(4096), route(8192)
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    pool.arena.live.pop(b.ptr)  # b's free will not find its block: the precise error
    del b
    assert len(reported) == 1 and "8192" not in str(reported[0]) and isinstance(reported[0], ValueError)
    exiting[0] = True
    c = route(4096)
    pool.arena.live.pop(c.ptr)
    del a, c
    assert late == [2, 1] and len(reported) == 1  # both counted, the failing one silently
    assert pool.live_bytes == 0


def test_a_block_in_a_garbage_cycle_is_freed_once():
    drv, pool = _pool()
    route = _route(pool)
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection between the two checks
    try:
        a = route(4096)
        a.cycle = a  # a pointer in a reference cycle: only the collector frees it
        del a
        assert pool.live_bytes == 4096
        gc.collect()
        assert pool.live_bytes == 0
    finally:
        if was_enabled:
            gc.enable()
    pool.release()
    assert _device_bytes(drv) == 0


@pytest.mark.parametrize("kind", ["pool", "vmm", "vmm(footprint_limit=1.1)"])
def test_threads_through_routes_racing_release_lose_nothing(switch_often, kind):
    """Four threads, each on its own stream through its own route over one caching resource, allocate
    and drop owners at random (a fifth of them dropped later by another thread) while a fifth thread
    releases the pool (trims the VMM): nothing is handed out twice, nothing is lost, and every byte
    goes back upstream."""
    if kind == "pool":
        drv, pool = _pool()
    else:
        drv = SimDriver([SimDeviceSpec(total_memory=1 << 30)], policy="eager")
        opts = VirtualMemoryResourceOptions(reserve_size=4 << 30,
                                            footprint_limit=1.1 if "limit" in kind else None)
        with python_core():
            pool = VirtualMemoryResource(0, opts, driver=drv)
    handed = HandOuts()
    streams = [Stream.create(driver=drv) for _ in range(4)]
    shared, shared_lock = [], threading.Lock()

    def worker(k):
        def work(errors):
            route = _route(pool, current=[streams[k]])
            rng = random.Random(k)
            live = []
            try:
                for _ in range(3000):
                    if live and (len(live) > 12 or rng.random() < 0.5):
                        p = live.pop(rng.randrange(len(live)))
                        if rng.random() < 0.2:  # dropped by another thread later
                            with shared_lock:
                                shared.append(p)
                            continue
                        handed.gave(p.ptr)
                        del p
                    else:
                        p = route(rng.choice((256, 4096, 65536, 1 << 20, rng.randrange(1, 1 << 21))))
                        handed.took(p.ptr)
                        live.append(p)
                        with shared_lock:
                            if shared:
                                handed.gave(shared[-1].ptr)
                                shared.pop()
                for p in live:
                    handed.gave(p.ptr)
                live.clear()
            except BaseException as exc:  # pragma: no cover - reported by race()
                errors.append(exc)
        return work

    race([worker(k) for k in range(4)], pool.release if kind == "pool" else pool.trim, period=0.0001)
    while shared:  # no loop variable left holding the last one
        handed.gave(shared.pop().ptr)
    assert pool.live_bytes == 0 and pool.arena.live == {}
    if kind == "pool":
        pool.release()
        assert pool.pool_size == 0 and _device_bytes(drv) == 0
    else:
        pool.trim()
        assert pool.mapped_bytes == 0 and pool.physical_bytes == 0
        pool.close()
    for s in streams:
        s.close()


def test_a_free_racing_a_flush_of_its_cache_loses_nothing_in_any_interleaving():
    """Rule 3 on the route's free path, under the kit's controlled interleavings: an owner dropped in
    one thread (its finalizer appends the block to its stream's cache) while another releases the pool
    (which swaps every cache out, then drains it). Whatever the interleaving, the block ends in a free
    list and release() gives every byte back."""
    from mrkit.testing import Schedule, controlled_locks, run_controlled

    drv = SimDriver([SimDeviceSpec(total_memory=1 << 30)])
    with controlled_locks():
        pool = PoolResource(CudaMemoryResource(driver=drv))
    route = _route(pool)
    for seed in range(40):
        for _ in range(3):  # 4096 is hot: its frees go to the cache
            route(4096)
        holder = [route(4096), route(8192)]

        def drop():
            del holder[:]

        run_controlled([drop, pool.release], Schedule.from_seed(seed, 2))
        assert pool.live_bytes == 0, seed
        pool.release()
        assert pool.pool_size == 0 and _device_bytes(drv) == 0, seed


@pytest.mark.parametrize("size, error, match", [
    (-1, ValueError, "size must be >= 0, got -1"), (-4096, ValueError, "got -4096"),
    (1.5, TypeError, "size must be an int, not float"), ("4096", TypeError, "not str"),
    (None, TypeError, "not NoneType"), (True, TypeError, "not bool"),
])
def test_a_bad_size_is_an_error_naming_size_in_both_builds(size, error, match):
    """The route (Python build) and the compiled rounding entry CuPy calls raise the same precise
    error for a size that is not an int >= 0, and allocate nothing; other integer types are taken."""
    import numpy as np
    from mrkit._engine import rounded_size, rounding_call
    drv, pool = _pool()
    route = _route(pool)
    with pytest.raises(error, match=match):
        route(size)
    with pytest.raises(error, match=match):
        rounded_size(size, 512)
    compiled = rounding_call(lambda n: n, 512)
    if compiled is not None:
        with pytest.raises(error, match=match):
            compiled(size)
        assert compiled(np.int64(1000)) == compiled(1000) == 1024 and compiled(0) == 0
        for big in (2**62, 2**62 + 1, 2**63 - 512, 2**63 - 1, 2**63, 2**64 + 3):  # rounded, never wrapped
            assert compiled(big) == rounded_size(big, 512) == (big + 511) & -512
    assert pool.live_bytes == 0 and pool.pool_size == 0
    p = route(np.int64(1000))
    assert p.mem.size == 1024 and type(pool.arena.live[p.ptr]) is int
