"""mrkit as CuPy's allocator on every device, per-device resources and ``mrkit.reinitialize``, on the
simulator with 2 and 4 devices and a stand-in CuPy with CuPy's semantics (``tests/fake_cupy.py``);
the real CuPy runs in tests/test_gpu_integrations.py."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import mrkit
from mrkit import (DEFAULT_STREAM, DeviceMemoryResource, LoggingAdaptor, PoolResource, StatisticsAdaptor,
                   VirtualMemoryResource, get_current_resource, read_log, set_current_resource)
from mrkit.driver import SimDriver, set_backend

import fake_cupy

HERE = Path(__file__).parent


@pytest.fixture
def sim4(monkeypatch):
    drv = SimDriver(4)
    set_backend(drv)
    monkeypatch.delenv("MRKIT_RESOURCE", raising=False)
    return drv


@pytest.fixture
def cupy(monkeypatch):
    fake = fake_cupy.make()
    for name in ("cupy", "cupy.cuda", "cupy.cuda.memory", "cupy.cuda.device"):
        monkeypatch.setitem(sys.modules, name, fake if name == "cupy" else
                            getattr(fake.cuda, name.rsplit(".", 1)[1]) if name != "cupy.cuda" else fake.cuda)
    return fake


def test_sizes_are_rounded_like_cupys_pool_and_the_block_really_has_them(sim4, cupy):
    import mrkit.cupy as mc
    pool = PoolResource(DeviceMemoryResource(0))
    fn = mc.allocator(pool)
    assert fn.rounding == mc.ALLOCATION_UNIT == 512
    mp = fn(1000)
    assert mp.mem.size == 1024 and pool.live_bytes == 1024  # CuPy code may read into the slack
    sim4.memset_async(mp.ptr + 1000, 1, 24, 0)  # CuPy code may write the slack: it is the block's own
    assert fn(512).mem.size == 512 and fn(1).mem.size == 512
    empty = fn(0)
    assert empty.ptr == 0 and empty.mem.size == 0
    del mp, empty
    assert pool.live_bytes == 0


@pytest.mark.parametrize("how", ["factory", "spec", "current"])
def test_one_allocator_serves_every_device_from_its_own_resource(sim4, cupy, how):
    import mrkit.cupy as mc
    if how == "factory":
        fn = mc.install(lambda device: PoolResource(DeviceMemoryResource(device)))
    elif how == "spec":
        fn = mc.install("statistics(pool(device))")
    else:
        for d in range(4):
            set_current_resource(PoolResource(DeviceMemoryResource(d)), d)
        fn = mc.install()
    assert cupy.cuda.get_allocator() is fn
    held = []
    for d in (2, 0, 3, 1):
        with cupy.cuda.Device(d):
            mp = cupy.empty(3000)
            assert mp.mem.device_id == d and sim4.pointer_info(mp.ptr)["device_ordinal"] == d
            mr = get_current_resource(d)
            assert mr.device_id == d and mc.resource_of() is mr
            if how == "spec":
                assert isinstance(mr, StatisticsAdaptor) and mr.statistics.current_bytes == 3072
            held.append((mr, mp))
    assert len({id(mr) for mr, _ in held}) == 4
    del mp
    held.clear()  # every block goes back to the resource of its own device
    for d in range(4):
        mr = get_current_resource(d)
        assert (mr.upstream if how == "spec" else mr).live_bytes == 0


def test_a_resource_of_one_device_refuses_another_before_taking_anything(sim4, cupy):
    import mrkit.cupy as mc
    pool = PoolResource(DeviceMemoryResource(1))
    fn = mc.allocator(pool)
    with cupy.cuda.Device(1):
        mp = fn(100)
    with pytest.raises(ValueError, match=r"current device is 2.*serves device 1"):
        with cupy.cuda.Device(2):
            fn(100)
    assert pool.live_bytes == 512
    del mp
    assert pool.live_bytes == 0


def test_changing_the_current_resource_redirects_new_blocks_and_old_ones_go_home(sim4, cupy):
    import mrkit.cupy as mc
    first = PoolResource(DeviceMemoryResource(0))
    set_current_resource(first, 0)
    fn = mc.install()
    old = fn(4096)
    assert mc.resource_of(fn) is first
    second = PoolResource(DeviceMemoryResource(0))
    set_current_resource(second, 0)
    assert mc.resource_of(fn) is second  # not the replaced one, before and after the next block
    new = fn(4096)
    assert mc.resource_of(fn) is second
    assert first.live_bytes == 4096 and second.live_bytes == 4096
    del old, new
    assert first.live_bytes == 0 and second.live_bytes == 0


def test_the_default_stream_of_a_resource_is_its_own_devices(sim4):
    # device 0 is current; device 1's resources take DEFAULT_STREAM as device 1's default stream
    for mr in (DeviceMemoryResource(1), PoolResource(DeviceMemoryResource(1)), VirtualMemoryResource(1)):
        for _ in range(3):  # fresh, then reused from the cache: each time without a race
            p = mr.allocate(1000, DEFAULT_STREAM)
            with sim4.on_device(1):
                sim4.memset_async(p, 7, 1000, 0)
            mr.deallocate(p, 1000, DEFAULT_STREAM)
        assert sim4.current_device() == 0
        mr.close() if hasattr(mr, "close") else None


def test_allocator_under_threads_on_four_devices_conserves_every_byte(sim4, cupy):
    import mrkit.cupy as mc
    from mrkit import CudaMemoryResource
    pools = [PoolResource(CudaMemoryResource(d)) for d in range(4)]
    for d, p in enumerate(pools):
        set_current_resource(p, d)
    fn = mc.install()
    errors, seen = [], [set() for _ in range(8)]

    def work(t):
        try:
            held = []
            with cupy.cuda.Device(t % 4):  # CuPy's current device is per thread
                for i in range(400):
                    mp = fn(100 + 37 * i)
                    assert sim4.pointer_info(mp.ptr)["device_ordinal"] == mp.mem.device_id == t % 4
                    held.append(mp)
                    if i % 3 == 2:
                        held.pop(0)
                        held.pop()
                    seen[t].update(m.ptr for m in held)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    assert [p.live_bytes for p in pools] == [0, 0, 0, 0]
    for p in pools:
        p.release()
    assert all(sim4.mem_get_info(d)[0] == sim4.mem_get_info(d)[1] for d in range(4))  # every byte home


# -- reinitialize ----------------------------------------------------------------------------------
def test_reinitialize_sets_up_each_device_with_pool_sizes_logs_and_statistics(sim4, cupy, tmp_path):
    import mrkit.cupy as mc
    got = mrkit.reinitialize("pool", devices=[0, 2], initial_pool_size=0.25, maximum_pool_size="1 GiB",
                             log_file=tmp_path / "mem.csv", statistics=True, cupy=True)
    assert sorted(got) == [0, 2]
    total = sim4.mem_get_info(0)[1]
    for d, mr in got.items():
        assert get_current_resource(d) is mr and isinstance(mr, StatisticsAdaptor)
        log = mr.upstream
        assert isinstance(log, LoggingAdaptor) and isinstance(log.upstream, PoolResource)
        assert log.upstream.pool_size == -(-total // 4 // (2 << 20)) * (2 << 20)
        assert log.upstream.device_id == d
    assert not isinstance(get_current_resource(1), StatisticsAdaptor)  # device 1 left alone
    assert mc.resource_of(cupy.cuda.get_allocator()) is got[0]
    with cupy.cuda.Device(2):
        mp = cupy.empty(5000)
    assert got[2].statistics.current_bytes == 5120
    del mp
    mrkit.reinitialize()  # back to the defaults: closes the logs it opened
    assert [e.action for e in read_log(tmp_path / "mem.device2.csv")] == ["allocate", "free"]
    assert read_log(tmp_path / "mem.csv") == []
    assert isinstance(get_current_resource(0), DeviceMemoryResource)


def test_reinitialize_without_devices_builds_each_device_lazily(sim4):
    got = mrkit.reinitialize("vmm")
    assert got == {}
    assert isinstance(get_current_resource(3), VirtualMemoryResource) and get_current_resource(3).device_id == 3
    got = mrkit.reinitialize(lambda d: PoolResource(DeviceMemoryResource(d), maximum_size="64 MiB"), devices=[1])
    assert got[1].device_id == 1 and get_current_resource(1) is got[1]
    mrkit.reinitialize()


def test_a_failed_reinitialize_closes_and_forgets_the_logs_it_opened(sim4, tmp_path):
    from mrkit import _setup

    def factory(d):
        if d == 1:
            raise RuntimeError("no pool for device 1")
        return PoolResource(DeviceMemoryResource(d))
    before = get_current_resource(0)
    with pytest.raises(RuntimeError, match="device 1"):
        mrkit.reinitialize(factory, devices=[0, 1], log_file=tmp_path / "m.csv")
    assert get_current_resource(0) is before and _setup._owned_logs == []  # nothing kept, nothing swapped
    got = mrkit.reinitialize("pool", devices=[0], log_file=tmp_path / "m.csv")
    assert _setup._owned_logs == [got[0]]
    mrkit.reinitialize()
    assert _setup._owned_logs == []


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"resource": "nonsense"}, ValueError, "resource"),
    ({"devices": [7]}, ValueError, "devices"),
    ({"devices": "0"}, TypeError, "devices"),
    ({"initial_pool_size": 1.5}, ValueError, "initial_pool_size"),
    ({"initial_pool_size": -1}, ValueError, "initial_pool_size"),
    ({"maximum_pool_size": 0.0}, ValueError, "maximum_pool_size"),
    ({"initial_pool_size": "2 GiB", "maximum_pool_size": "1 GiB"}, ValueError, "initial"),
    ({"resource": "cuda", "initial_pool_size": "1 GiB"}, ValueError, "initial_pool_size"),
    ({"statistics": "yes"}, TypeError, "statistics"),
    ({"devices": [0, 0]}, ValueError, "devices: 0 is given twice"),
])
def test_reinitialize_rejects_bad_arguments_and_changes_nothing(sim4, kwargs, exc, match):
    before = get_current_resource(0)
    with pytest.raises(exc, match=match):
        mrkit.reinitialize(**{"devices": [0], **kwargs})
    assert get_current_resource(0) is before


# -- exit ------------------------------------------------------------------------------------------
_TEARDOWN = """
import sys, gc
sys.path.insert(0, {tests!r})
import fake_cupy
cupy = fake_cupy.install(devices=2)
import mrkit, mrkit.cupy
from mrkit.driver import SimDriver, set_backend
set_backend(SimDriver(2))
mrkit.reinitialize("pool", log_file={log!r}, statistics=True, cupy=True)
arrays = [cupy.empty(1000 + i) for i in range(40)]          # module globals: freed at teardown
with cupy.cuda.Device(1):
    more = [cupy.empty(64 * i + 1) for i in range(1, 30)]
class Cycle:
    pass
c = Cycle(); c.self = c; c.blocks = [cupy.empty(4096) for _ in range(10)]  # freed by the last gc
del c
gc.disable()
print("ok", flush=True)
"""


def test_exit_with_live_cupy_arrays_is_silent_and_the_log_is_complete(tmp_path):
    log = tmp_path / "mem.csv"
    script = _TEARDOWN.format(tests=str(HERE), log=str(log))
    env = dict(os.environ, MRKIT_BACKEND="sim")
    env.pop("MRKIT_RESOURCE", None)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "", r.stderr
    events = read_log(log) + read_log(tmp_path / "mem.device1.csv")
    allocs = [e for e in events if e.action == "allocate"]
    frees = [e for e in events if e.action == "free"]
    assert len(allocs) == 79 and sorted(e.pointer for e in frees) == sorted(e.pointer for e in allocs)


def test_hooks_and_their_resource_outlive_a_garbage_cycle_holding_a_block(sim4, cupy):
    # CuPy's memory objects call their free hook from __dealloc__, which for an object in a cycle runs
    # after the collector cleared the rest of the cycle: the hook and its resource must not be part
    # of that garbage (a cleared function crashes the interpreter; a cleared adaptor raises)
    import gc
    import weakref
    import mrkit.cupy as mc
    mr = StatisticsAdaptor(PoolResource(DeviceMemoryResource(0)))
    fn = mc.allocator(mr)
    mp = fn(1000)
    from mrkit.integrations.cupy import _hooks_made
    free_ref, mr_ref = weakref.ref(_hooks_made[-1][1]), weakref.ref(mr)

    class Box:
        pass
    box = Box()
    box.box, box.mp, box.fn, box.mr = box, mp, fn, mr
    del mp, fn, mr, box
    gc.collect()
    assert free_ref() is not None and mr_ref() is not None  # kept for the life of the process
    assert mr_ref().statistics.current_bytes == 0  # the block went back through its hook


def test_a_block_whose_memory_object_the_collector_clears_first_still_goes_home(sim4, cupy, monkeypatch):
    # CuPy's compiled memory objects in a garbage cycle are cleared (object fields set to None) before
    # they are deallocated; a free function held by the memory object was gone by then ("Exception
    # ignored ... 'NoneType' object is not callable") and the block never went back
    import mrkit.cupy as mc
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    for mr in (PoolResource(DeviceMemoryResource(0)), StatisticsAdaptor(DeviceMemoryResource(0))):
        fn = mc.allocator(mr)
        blocks = [fn(n) for n in (1, 1000, 4096, 1 << 20)]
        held = sum(mp.mem.size for mp in blocks)
        assert _held(mr) == held
        for mp in blocks:
            cupy.gc_clear(mp.mem)  # what tp_clear does to the memory object first
        del blocks, mp
        gc.collect()  # the Python build's memory objects have a finalizer: gc_clear left them in a cycle
        assert unraisable == [] and _held(mr) == 0, [u.exc_value for u in unraisable]
    empty = fn(0)  # size 0: a null pointer, no owner, nothing taken
    assert empty.ptr == 0 and empty.mem.size == 0 and _held(mr) == 0


def _held(mr):
    return mr.live_bytes if isinstance(mr, PoolResource) else mr.statistics.current_bytes


def test_a_block_outliving_its_allocator_still_goes_home(sim4, cupy):
    # CuPy's CFunctionAllocatorMemory keeps only the address of mrkit's C hooks, not a reference: the
    # hooks must outlive the allocator (a replaced allocator whose hooks died crashed the interpreter
    # at the next free of one of its blocks)
    import gc
    import mrkit.cupy as mc
    mr = StatisticsAdaptor(PoolResource(DeviceMemoryResource(0)))
    fn = mc.allocator(mr)
    blocks = [fn(n) for n in (1, 1000, 1 << 20)]
    del fn
    gc.collect()
    assert mr.statistics.current_bytes == sum(b.mem.size for b in blocks)
    del blocks
    gc.collect()
    assert mr.statistics.current_bytes == 0


def test_allocator_hooks_refuse_bad_arguments_by_name(sim):
    from mrkit.cupy import AllocatorHooks
    with pytest.raises(TypeError, match="get_stream must be a callable"):
        AllocatorHooks(None, 5)
    with pytest.raises(TypeError, match="mr must be a MemoryResource"):
        AllocatorHooks("pool(device)")
    with pytest.raises(ValueError, match="not device-accessible"):
        AllocatorHooks(mrkit.HostMemoryResource())
