"""Integrations without a GPU: resource specs, MRKIT_RESOURCE, DLPack on host memory, CuPy hook wiring."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import types

import numpy as np
import pytest

import mrkit
from mrkit import (
    DEFAULT_STREAM, Adaptor, HostMemoryResource, LimitingAdaptor, PoolResource, StatisticsAdaptor, Stream,
    parse_spec, resource_from_spec,
)


def test_specs_build_compositions(sim):
    mr = resource_from_spec("statistics(limiting(pool(device), 8GiB))")
    assert isinstance(mr, StatisticsAdaptor) and isinstance(mr.upstream, LimitingAdaptor)
    assert mr.upstream.limit == 8 << 30 and isinstance(mr.upstream.upstream, PoolResource)
    mr = resource_from_spec("pool(cuda(0), initial_size=1MiB, maximum_size = 4 MiB)")
    assert mr.pool_size == 1 << 20 and mr.maximum_size == 4 << 20
    assert isinstance(resource_from_spec("pool(host)").upstream, HostMemoryResource)


@pytest.mark.parametrize("spec,pos,words", [
    ("statistics(pool(device)", 23, "expected ')'"),
    ("stats(device)", 0, "unknown resource 'stats'"),
    ("limiting(device, 8 GB!)", 21, "unexpected character '!'"),
    ("pool(device,, 1)", 12, "expected a resource"),
    ("limiting(device)", 0, "limiting needs limit"),
    ("pool(device) x", 13, "unexpected 'x'"),
    ("pool(initial_size=1MiB, device)", 24, "positional argument after a keyword"),
])
def test_bad_specs_name_the_position(spec, pos, words):
    with pytest.raises(ValueError) as e:
        parse_spec(spec)
    msg = str(e.value)
    assert words in msg and f"at position {pos}" in msg and msg.endswith(" " * (pos + 2) + "^")


def test_mrkit_resource_environment_variable():
    code = ("import mrkit; r = mrkit.get_current_resource(); "
            "print(type(r).__name__, type(r.upstream).__name__)")
    env = {"MRKIT_BACKEND": "sim", "MRKIT_RESOURCE": "statistics(pool(device))", "PATH": ""}
    import os
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["StatisticsAdaptor", "PoolResource"], out.stderr
    env["MRKIT_RESOURCE"] = "statistics(pool(device)"
    out = subprocess.run([sys.executable, "-c", "import mrkit; mrkit.get_current_resource()"],
                         capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "at position 23" in out.stderr


def test_dlpack_zero_copy_on_host_memory():
    mr = HostMemoryResource()
    buf = mr.allocate_buffer(16)
    mr.view(buf.ptr, 16)[:] = bytes(range(16))
    arr = np.from_dlpack(buf)
    assert arr.dtype == np.uint8 and arr.shape == (16,) and arr.ctypes.data == buf.ptr
    mr.view(buf.ptr, 1)[:] = b"c"
    assert arr[0] == 99  # the same bytes: zero-copy
    arr[1] = 7  # NumPy asks for DLPack 1.x: a versioned capsule, writable
    assert bytes(mr.view(buf.ptr + 1, 1)) == b"\x07"
    legacy = np.from_dlpack(types.SimpleNamespace(
        __dlpack__=lambda **kw: buf.__dlpack__(), __dlpack_device__=buf.__dlpack_device__))
    assert legacy.ctypes.data == buf.ptr and not legacy.flags.writeable  # the 0.8 ABI still works
    del legacy
    assert buf.__dlpack_device__() == (1, 0)
    del buf
    assert mr.live_bytes == 16  # the array keeps the memory alive
    del arr
    assert mr.live_bytes == 0
    unconsumed = mr.allocate_buffer(8).__dlpack__()
    del unconsumed
    assert mr.live_bytes == 0
    with pytest.raises(BufferError):
        mr.allocate_buffer(8).__dlpack__(copy=True)


def test_dlpack_device_and_consumer_stream_on_device_memory(sim):
    pool = PoolResource(mrkit.DeviceMemoryResource())
    s, consumer = Stream.create(), Stream.create()
    buf = pool.allocate_buffer(4096, s)
    sim.memset_async(buf.ptr, 1, 4096, s.handle)
    assert buf.__dlpack_device__() == (2, 0)
    cap = buf.__dlpack__(stream=consumer.handle)  # the consumer is ordered after s's work
    sim.touch(buf.ptr, 4096, consumer.handle)
    with pytest.raises(ValueError):
        buf.__dlpack__(stream=0)
    del cap


def _fake_cupy(monkeypatch):
    import fake_cupy
    fake = fake_cupy.make()
    for name, mod in (("cupy", fake), ("cupy.cuda", fake.cuda), ("cupy.cuda.memory", fake.cuda.memory),
                      ("cupy.cuda.device", fake.cuda.device)):
        monkeypatch.setitem(sys.modules, name, mod)
    return fake


class _Recording(Adaptor):
    """Records (action, ptr, nbytes, stream uid) for every call."""

    def __init__(self, upstream):
        super().__init__(upstream)
        self.events = []

    def allocate(self, nbytes, stream, alignment=256):
        ptr = super().allocate(nbytes, stream, alignment)
        self.events.append(("allocate", ptr, nbytes, stream.uid))
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        self.events.append(("free", ptr, nbytes, stream.uid))
        super().deallocate(ptr, nbytes, stream, alignment)


def test_cupy_hooks_are_wired(sim, monkeypatch):
    fake = _fake_cupy(monkeypatch)
    calls = fake.state["calls"]
    import mrkit.cupy as mcupy

    mr = _Recording(StatisticsAdaptor(PoolResource(mrkit.DeviceMemoryResource())))
    fn = mcupy.install(mr)
    assert calls == [("set_allocator", fn)] and mcupy.resource_of(fn) is mr and mcupy.resource_of() is mr
    assert mcupy.resource_of(print) is None
    mp = fn(1000)
    assert mp.mem.device_id == 0 and mp.mem.size == 1024 and mr.statistics.current_bytes == 1024
    assert mr.events[-1] == ("allocate", mp.ptr, 1024, DEFAULT_STREAM.uid)  # CuPy's null stream
    s = Stream.create()
    fake.state["streams"][0] = fake.Stream(s.handle)
    mp2 = fn(64)
    mp3 = fn(64)  # the remembered CuPy stream gives the same mrkit stream
    assert mr.events[-2:] == [("allocate", mp2.ptr, 512, s.uid), ("allocate", mp3.ptr, 512, s.uid)]
    fake.state["streams"].clear()  # CuPy frees with no stream: each block on its own stream
    p1, p2 = mp.ptr, mp2.ptr
    del mp, mp2
    assert set(mr.events[-2:]) == {("free", p1, 1024, DEFAULT_STREAM.uid), ("free", p2, 512, s.uid)}
    del mp3
    assert mr.statistics.current_bytes == 0
    fake.state["device"] = 1  # a device other than the resource's is refused before anything is taken
    with pytest.raises(ValueError, match="current device is 1"):
        fn(64)
    fake.state["device"] = 0
    assert mr.statistics.current_bytes == 0
    pinned = mcupy.install_pinned()
    block = pinned(128)
    sim.write(block.ptr, b"x" * 128)
    assert calls[-1] == ("set_pinned", pinned) and mcupy.resource_of(pinned) is pinned.resource
    with pytest.raises(ValueError, match="not host-accessible"):
        mcupy.pinned_allocator(mrkit.DeviceMemoryResource())
    with pytest.raises(ValueError, match="not device-accessible"):
        mcupy.allocator(HostMemoryResource())
    with pytest.raises(TypeError, match="mr must be"):
        mcupy.allocator("pool(device)")


def test_cupy_hooks_over_a_pool_are_the_pools_hot_path(sim, monkeypatch):
    fake = _fake_cupy(monkeypatch)
    import mrkit.cupy as mcupy

    pool = PoolResource(mrkit.DeviceMemoryResource())
    fn = mcupy.allocator(pool)
    mp = fn(1000)  # on CuPy's null stream
    from mrkit.integrations.cupy import _hooks_made
    malloc, free, holds, core = _hooks_made[-1]  # the hooks made for this pool
    if core is not None:  # compiled build: the engine's HookPaths, called from C by CuPy
        assert holds(mp.ptr)
        assert type(core).__name__ == "HookPaths" and fn.hooks is not None
    else:  # Python build: CuPy calls the engine's route itself, a real function in a real file, and the
        # block's memory object frees it (its finalizer is the engine's free path; its owner the stream)
        assert fn.__code__.co_name == "route" and fn.__code__.co_filename.endswith("_engine/_hot.py")
        mem = mp.mem
        assert isinstance(mem, fake.cuda.memory.UnownedMemory) and mem._owner is mrkit.DEFAULT_STREAM
        assert type(mem).__del__.__code__.co_filename.endswith("_engine/_hot.py")
        assert pool.arena.live[mp.ptr] == 1024
        del mem
    s = Stream.create()
    fake.state["streams"][0] = fake.Stream(s.handle)
    mp2 = fn(1000)  # on s
    assert pool.live_bytes == 2048
    p1, p2 = mp.ptr, mp2.ptr
    fake.state["streams"].clear()
    del mp, mp2  # CuPy frees with no stream: each block goes back to its own stream's cache
    assert pool.live_bytes == 0
    assert fn(1000).ptr == p1  # the null stream gets back only what was freed on it
    fake.state["streams"][0] = fake.Stream(s.handle)
    assert fn(1000).ptr == p2
    fake.state["device"] = 1
    with pytest.raises(ValueError, match="current device is 1"):
        fn(64)
    fake.state["device"] = 0
    assert pool.live_bytes == 0
    free = _hooks_made[-1][1]
    with pytest.raises(ValueError, match="does not hold"):
        free(0xdead00, 0)
    with pytest.raises(ValueError, match="size must be >= 0"):  # both builds: nothing allocated
        fn(-1)
    with pytest.raises(TypeError, match="size must be an int"):
        fn(2.5)
    assert pool.live_bytes == 0


def test_an_error_of_the_c_hooks_reaches_the_caller_of_real_cupy_typed():
    """Real CuPy 14 (no GPU needed: its ``CFunctionAllocatorMemory`` calls the C ``malloc`` it is
    given): an error raised behind mrkit's C hooks reaches CuPy's caller as itself. CuPy calls the
    function through an ``intptr_t`` helper compiled under Cython's ``except? -1``, which looks for an
    exception only when -1 comes back; the hooks returned NULL with the exception set, and CuPy failed
    with SystemError instead (on the H100, every OutOfMemoryError through ``cupy.empty``). A block
    handed out still goes back through the free hook when CuPy drops its memory."""
    cupy = pytest.importorskip("cupy", reason="real CuPy's memory classes (the fake models them elsewhere)")
    hotc = pytest.importorskip("mrkit._engine._hotc", reason="the C hooks are the compiled build's")
    freed = []

    def malloc(n, dev):
        if n > 1 << 40:
            raise mrkit.OutOfMemoryError(f"could not allocate {n} bytes", n)
        return 0x7F0000

    table = {0: (malloc, lambda p, dev: freed.append((p, dev)), lambda p: p == 0x7F0000, None)}
    hooks = hotc.CHooks(table, table.__getitem__, [], [False], [0, 0])
    param, m, f = hooks.addresses
    Memory = cupy.cuda.memory.CFunctionAllocatorMemory
    mem = Memory(1024, param, m, f, 0)
    assert mem.ptr == 0x7F0000
    del mem
    assert freed == [(0x7F0000, 0)]
    for size in (1 << 41, 2**63 - 1, 2**63, 2**64 - 1):
        with pytest.raises(mrkit.OutOfMemoryError, match=f"could not allocate {size} bytes"):
            Memory(size, param, m, f, 0)
    assert freed == [(0x7F0000, 0)]  # nothing handed out, nothing freed
    # the fake CuPy's call is CuPy's: an error is seen only with -1 returned
    assert hotc.cupy_call_malloc(param, m, 1024, 0) == 0x7F0000
    with pytest.raises(mrkit.OutOfMemoryError):
        hotc.cupy_call_malloc(param, m, 1 << 41, 0)


@pytest.mark.parametrize("size", [2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70])
def test_a_size_no_device_holds_is_an_out_of_memory_error_naming_it_and_the_resource(sim, monkeypatch, size):
    """Both builds: a request past any device (up to and past what C's size_t holds) is the pool's
    OutOfMemoryError naming the rounded request and the resource, and changes nothing; it is never
    an overflow, a wrapped size, or a block handed out (the compiled rounding once wrapped 2**63 - 1
    to a negative size and returned a pointer)."""
    _fake_cupy(monkeypatch)
    import mrkit.cupy as mcupy
    pool = PoolResource(mrkit.DeviceMemoryResource())
    fn = mcupy.allocator(pool)
    want = (size + 511) & -512
    with pytest.raises(mrkit.OutOfMemoryError, match=f"PoolResource.*could not allocate {want} ") as got:
        fn(size)
    assert got.value.nbytes == want
    assert pool.live_bytes == 0 and pool.pool_size == 0
    assert fn(1000).mem.size == 1024 and pool.live_bytes == 1024  # and it still serves


def _fake_numba(monkeypatch):
    """Numba's EMM interface as Numba documents it: an abstract base whose host-only subclass leaves
    memalloc, initialize, get_ipc_handle, get_memory_info and interface_version abstract."""
    import abc
    import collections

    class BaseCUDAMemoryManager(abc.ABC):
        def __init__(self, *args, **kwargs):
            self.context = kwargs.get("context")

        for name in ("memalloc", "memhostalloc", "mempin", "initialize", "get_ipc_handle",
                     "get_memory_info", "reset", "defer_cleanup"):
            locals()[name] = abc.abstractmethod(lambda self, *a, **k: None)
        interface_version = property(abc.abstractmethod(lambda self: None))
        del name

    class HostOnlyCUDAMemoryManager(BaseCUDAMemoryManager):
        def memhostalloc(self, *a, **k): ...
        def mempin(self, *a, **k): ...
        def reset(self): ...
        def defer_cleanup(self): ...

    numba = types.ModuleType("numba")
    cuda = types.ModuleType("numba.cuda")
    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager
    cuda.MemoryInfo = collections.namedtuple("MemoryInfo", "free total")
    cuda.MemoryPointer = lambda *a, **k: (a, k)
    numba.cuda = cuda
    for name, mod in (("numba", numba), ("numba.cuda", cuda)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_numba_plugin_implements_numbas_whole_interface(monkeypatch):
    from mrkit.integrations.numba import make_manager_class
    _fake_numba(monkeypatch)
    cls = make_manager_class()
    assert not cls.__abstractmethods__, cls.__abstractmethods__
    mgr = cls(context=None)  # what numba.cuda.set_memory_manager does to check a plugin
    assert mgr.interface_version == 1
    mgr.initialize()


def test_numba_plugin_module_is_lazy():
    import mrkit.numba  # importing it needs no numba
    assert "numba" not in sys.modules or hasattr(mrkit.numba, "__getattr__")


@pytest.mark.parametrize("build", ["compiled", "python"])
def test_the_hooks_read_the_stream_they_remember_weakly_and_never_take_a_new_object_for_a_dead_one(sim, build):
    """Both builds: the hooks remember the caller's last stream object weakly (the compiled build reads
    the weak reference in C); once that object is collected, a new current object (possibly at its
    address) is a new stream, never the remembered one: each block is allocated on, and goes back to,
    the stream its own current object names. Every byte back at the end."""
    import gc
    from mrkit._engine import core_name, hot_paths, python_core
    from mrkit.integrations.cupy import _foreign_free, _stream_lookup
    if build == "compiled" and core_name() != "compiled":
        pytest.skip("the compiled core is not built here")

    class CupyLikeStream:  # a foreign stream object: its handle through __cuda_stream__
        __slots__ = ("handle", "__weakref__")

        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            return (0, self.handle)

    with python_core() if build == "python" else contextlib.nullcontext():
        pool = PoolResource(mrkit.DeviceMemoryResource())
    current, converted = [None], []
    cell, lookup = _stream_lookup()

    def remember(cs):  # the hooks convert a stream object they do not remember
        converted.append(cs)
        return lookup(cs)
    malloc, free, holds, core = hot_paths(pool, "hook", current_stream=lambda dev: current[0], seen=cell,
                                          remember=remember, foreign_free=_foreign_free)
    s1, s2 = Stream.create(), Stream.create()
    for _ in range(3):
        current[0] = CupyLikeStream(s1.handle)
        a = malloc(1000, 0)
        assert converted[-1] is current[0]
        n = len(converted)
        c = malloc(1000, 0)
        free(a, 0)
        assert len(converted) == n and cell[0][0]() is current[0]  # the live object: remembered, not converted
        converted.clear()
        current[0] = None
        gc.collect()
        assert cell[0][0]() is None  # the remembered object is gone
        current[0] = CupyLikeStream(s2.handle)  # possibly at its address
        b = malloc(1000, 0)
        assert converted == [current[0]], "a new stream object was taken for the collected one"
        assert cell[0][0]() is current[0] and cell[0][1].handle == s2.handle
        free(b, 0)
        free(c, 0)
    assert pool.live_bytes == 0
    pool.release()
    assert pool.free_bytes == 0
