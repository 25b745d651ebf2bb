"""The benchmarks' own loops: each allocator is timed through the calls its users write (no wrapper that
another allocator goes without), and each loop frees everything it allocates. Run on the simulator
through mrkit's resources (the other libraries' loops have the same shape and need a GPU)."""
from __future__ import annotations

import importlib.util
import pathlib

from mrkit import Stream
from mrkit.driver import SimDeviceSpec, SimDriver, set_backend

_BENCH = pathlib.Path(__file__).parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _counting(mr):
    """``mr.allocate``/``mr.deallocate`` counted, and checked: nothing handed out twice while live."""
    live, calls = {}, [0, 0]

    def a(n, s):
        p = mr.allocate(n, s)
        assert p not in live
        live[p] = n
        calls[0] += 1
        return p

    def d(p, n, s):
        assert live.pop(p) == n  # the size allocated, freed once
        calls[1] += 1
        mr.deallocate(p, n, s)
    return a, d, live, calls


def test_bench_pool_random_loop_calls_allocate_and_deallocate_directly_and_frees_everything():
    """``bench_pool.random_workload`` times each allocator's ``random_loop`` (``peer[5]``): for mrkit,
    ``allocate(n, s)`` and ``deallocate(p, n, s)`` in the loop itself, every allocation freed once with
    its own size by the end; the pool holds nothing live afterwards."""
    drv = SimDriver([SimDeviceSpec(total_memory=8 << 30)])
    set_backend(drv)
    bp = _load("bench_pool")
    streams = [Stream.create(0) for _ in range(8)]
    peer = bp.mrkit_peer("pool", streams)
    assert len(peer) == 6
    cells = [c.cell_contents for c in peer[5].__closure__]
    assert any(getattr(c, "__name__", "") == "allocate" for c in cells)  # the resource's own method
    assert not any(getattr(c, "__name__", "") == "<lambda>" for c in cells)
    from mrkit import DeviceMemoryResource, PoolResource
    pool = PoolResource(DeviceMemoryResource(0))
    a, d, live, calls = _counting(pool)
    loop = bp._random_loop_explicit(a, d, streams[0])
    us = bp.random_workload(peer[:5] + (loop,), 400, seed=3, replay=True)
    assert us > 0 and calls[0] == calls[1] > 150 and not live  # two runs, each freed to the end
    assert pool.live_bytes == 0
    pool.release()
    assert pool.pool_size == 0


def test_bench_workload_timed_loop_is_the_allocators_own_and_frees_what_the_pass_leaves():
    """``bench_workload``'s timed passes run ``_make(name)[5]``: mrkit's ``allocate(n, s)`` /
    ``deallocate(p, n, s)`` called from the loop (no lambda between); the blocks a pass leaves live are
    in ``handles``, and freeing them with their sizes returns every byte to the driver's pool."""
    drv = SimDriver([SimDeviceSpec(total_memory=16 << 30)])
    set_backend(drv)
    bw = _load("bench_workload")
    alloc, free, close, moves, driver, run = bw._make("mrkit pool")
    assert run.__closure__ and not any(getattr(c.cell_contents, "__name__", "") == "<lambda>"
                                       for c in run.__closure__)
    steps = bw.plan(600, 64 << 20, 1 << 30, seed=5)
    handles = {}
    run(steps, handles)
    sizes = {k: n for kind, n, k in steps if kind == "a"}
    freed = {k for kind, _, k in steps if kind == "f"}
    assert set(handles) == set(sizes) - freed and len(set(handles.values())) == len(handles)
    for k, p in handles.items():
        free(p, sizes[k])
    close()
    from mrkit import DeviceMemoryResource
    assert DeviceMemoryResource(0).pool.used_mem_current == 0  # every byte back in the driver's pool
