"""Package surface, errors, sizes, streams, Buffer, current resources, the CLI, the cuda backend without a driver."""
from __future__ import annotations

import json
import subprocess
import sys
import weakref

import pytest

import mrkit
from mrkit import (
    DEFAULT_STREAM, CUDAError, CUDAUnavailableError, CudaMemoryResource, HostMemoryResource,
    OutOfMemoryError, Stream, as_stream, parse_size,
)
from mrkit.driver import CudaDriver, SimDriver

EXPECTED_ALL = {
    "MrkitError", "CUDAError", "CUDAUnavailableError", "OutOfMemoryError", "StreamOrderViolation",
    "SimulatorFallbackWarning", "get_current_device_resource", "set_current_device_resource",
    "MemoryResource", "Buffer", "get_current_resource", "set_current_resource", "using", "set_resource_factory", "reinitialize",
    "parse_size", "format_size", "Stream", "Event", "DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM",
    "as_stream", "get_driver", "set_backend", "use_backend", "CudaMemoryResource",
    "DeviceMemoryResource", "DeviceMemoryResourceOptions", "HostMemoryResource",
    "ManagedMemoryResource", "MemoryPool", "PinnedMemoryResource", "PoolResource", "BinningResource", "Adaptor",
    "VirtualMemoryResource", "VirtualMemoryResourceOptions",
    "LimitingAdaptor", "LoggingAdaptor", "RetryAdaptor", "Statistics", "StatisticsAdaptor",
    "TrackingAdaptor", "read_log", "replay", "parse_spec", "resource_from_spec", "__version__",
    "snapshot", "dump_snapshot", "snapshot_from_log",
}


def test_public_surface_is_pinned():
    assert set(mrkit.__all__) == EXPECTED_ALL
    assert len(mrkit.__all__) == len(EXPECTED_ALL)
    for name in mrkit.__all__:
        assert hasattr(mrkit, name), name


def test_errors_carry_their_details():
    e = CUDAError("CUDA_ERROR_INVALID_VALUE", 1, "cuMemMap", "invalid argument")
    assert (e.name, e.code, e.call) == ("CUDA_ERROR_INVALID_VALUE", 1, "cuMemMap")
    assert "cuMemMap failed: CUDA_ERROR_INVALID_VALUE (1): invalid argument" == str(e)
    import pickle
    assert str(pickle.loads(pickle.dumps(e))) == str(e)
    assert issubclass(OutOfMemoryError, MemoryError)
    assert issubclass(CUDAUnavailableError, CUDAError)


@pytest.mark.parametrize("text,value", [("8 GiB", 8 << 30), ("512MB", 512_000_000), ("1.5KiB", 1536),
                                        (4096, 4096), ("0", 0), ("3 b", 3)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad,exc", [("8 GB!", ValueError), (-1, ValueError), (True, TypeError),
                                     (1.5, TypeError), ("0.3 B", ValueError)])
def test_parse_size_rejects(bad, exc):
    with pytest.raises(exc, match="limit"):
        parse_size(bad, "limit")


def test_no_driver_means_a_clear_error_never_an_import_failure():
    try:
        CudaDriver().device_count()
    except CUDAUnavailableError as exc:
        assert exc.name == "CUDA_DRIVER_NOT_FOUND" and "MRKIT_BACKEND=sim" in str(exc)
        assert not isinstance(exc, RuntimeError)  # the loader's RuntimeError never leaks
    else:
        pytest.skip("a CUDA driver is present on this machine")
    out = subprocess.run([sys.executable, "-c", "import mrkit, mrkit.testing; print('ok')"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_backend_from_environment(monkeypatch):
    from mrkit.driver import reset_backend, get_driver
    monkeypatch.setenv("MRKIT_BACKEND", "sim")
    reset_backend()
    assert isinstance(get_driver(), SimDriver)
    monkeypatch.setenv("MRKIT_BACKEND", "tpu")
    reset_backend()
    with pytest.raises(ValueError, match="MRKIT_BACKEND='tpu' is not a backend"):
        get_driver()


# -- streams ----------------------------------------------------------------------------------
def test_streams_have_stable_identity_across_handle_reuse(sim):
    s = Stream.create()
    uid, handle = s.uid, s.handle
    assert s.__cuda_stream__() == (0, handle)
    s.close()
    t = Stream.create()
    assert t.handle == handle and t.uid != uid and t != s


def test_stream_normalisation(sim):
    s = Stream.create()
    assert as_stream(s) is s
    assert as_stream(0) is DEFAULT_STREAM and as_stream(1) is DEFAULT_STREAM
    assert as_stream(2) is mrkit.PER_THREAD_DEFAULT_STREAM
    assert as_stream(s.handle).uid == s.uid

    class Foreign:  # any object speaking the CUDA Python stream protocol
        def __init__(self, h):
            self.h = h

        def __cuda_stream__(self):
            return (0, self.h)

    f = Foreign(s.handle)
    w = as_stream(f)
    assert w.uid == s.uid and as_stream(f) is w  # cached per object
    ref = weakref.ref(f)
    del f
    assert ref() is None and w._owner_ref() is None  # the cache does not keep it alive

    class Bad:
        def __cuda_stream__(self):
            return (1, 2, 3)

    with pytest.raises(TypeError, match="__cuda_stream__"):
        as_stream(Bad())
    for bad, exc in ((None, TypeError), (True, TypeError), ("s", TypeError), (-1, ValueError), (3.0, TypeError)):
        with pytest.raises(exc, match="stream"):
            as_stream(bad)


def test_events_and_waits(sim):
    a, b = Stream.create(), Stream.create()
    p = sim.mem_alloc(0, 64)
    sim.memset_async(p, 1, 64, a.handle)
    ev = a.record()
    assert not ev.query()
    b.wait(ev)
    sim.memset_async(p, 2, 64, b.handle)  # ordered through the event
    b.wait(a)  # a stream: wait for all its work so far
    b.synchronize()
    assert ev.query() and a.query()
    ev.close()
    with a, b:
        pass
    assert a._closed and b._closed


# -- resources, Buffer, current resource -------------------------------------------------------
def test_buffer_owns_memory(sim):
    mr = CudaMemoryResource()
    s = Stream.create()
    with mr.allocate_buffer(1000, s) as buf:
        assert buf.size == len(buf) == 1000 and mr.live_bytes == 1000
        cai = buf.__cuda_array_interface__
        assert cai["data"] == (buf.ptr, False) and cai["shape"] == (1000,) and cai["stream"] == s.handle
    assert buf.closed and mr.live_bytes == 0
    buf.close()  # idempotent
    b2 = mr.allocate_buffer(10)
    assert b2.__cuda_array_interface__["stream"] == 1  # the legacy default stream, per the CAI spec
    del b2
    assert mr.live_bytes == 0  # garbage collection returns it
    with pytest.raises(AttributeError):
        HostMemoryResource().allocate_buffer(8).__cuda_array_interface__


def test_current_resource_is_per_device(sim):
    from mrkit import DeviceMemoryResource, get_current_resource, set_current_resource, using
    default = get_current_resource()
    assert isinstance(default, DeviceMemoryResource) and get_current_resource(0) is default
    host = HostMemoryResource()
    with using(host, device=0):
        assert get_current_resource() is host
    assert get_current_resource() is default
    assert set_current_resource(host, 0) is default
    with pytest.raises(TypeError):
        set_current_resource("pool")
    with pytest.raises(ValueError):
        get_current_resource(-1)


def test_default_resource_without_pools_is_cuda_memory():
    from mrkit import get_current_resource
    from mrkit.driver import SimDeviceSpec
    mrkit.set_backend(SimDriver([SimDeviceSpec(memory_pools=False)]))
    assert isinstance(get_current_resource(), CudaMemoryResource)


def test_host_resource_works_without_any_gpu():
    mr = HostMemoryResource()
    p = mr.allocate(100, DEFAULT_STREAM, 4096)
    assert p % 4096 == 0
    mr.view(p, 100)[:] = b"x" * 100
    assert bytes(mr.view(p, 3)) == b"xxx"
    mr.deallocate(p, 100, DEFAULT_STREAM, 4096)
    with pytest.raises(OutOfMemoryError):
        mr.allocate(1 << 62, 0)


def test_cuda_resource_errors_name_things(sim):
    mr = CudaMemoryResource()
    with pytest.raises(OutOfMemoryError, match=r"CudaMemoryResource.*could not allocate 4294967296 bytes"):
        mr.allocate(4 << 30, DEFAULT_STREAM)
    with pytest.raises(CUDAError) as e:
        CudaMemoryResource(5)
    assert e.value.name == "CUDA_ERROR_INVALID_DEVICE"
    with pytest.raises(ValueError, match="alignment 512 is larger"):
        mr.allocate(8, DEFAULT_STREAM, 512)


# -- the command line --------------------------------------------------------------------------
def test_cli_info_and_demo(capsys):
    from mrkit._cli import main
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "mrkit 0.1.0" in out and "memory pools" in out and "virtual memory management" in out
    assert main(["demo", "--backend", "sim", "--ops", "200"]) == 0
    out = capsys.readouterr().out
    assert "was caught deterministically" in out and "peak live" in out


def test_cli_replay_compares_resources(tmp_path, capsys):
    from mrkit._cli import main
    log = tmp_path / "rmm.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,1.0,allocate,0x1000,4096,0x0\n1,1.1,allocate,0x3000,1000,0x0\n"
                   "1,1.2,free,0x1000,4096,0x0\n1,1.3,free,0x3000,1000,0x0\n")
    assert main(["replay", str(log), "--backend", "sim", "--resource", "statistics(pool(cuda))",
                 "--resource", "device", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # --json prints nothing but JSON
    assert [r["resource"] for r in doc["results"]] == ["statistics(pool(cuda))", "device"]
    assert all(r["peak_live_bytes"] == 5096 for r in doc["results"])  # 4096 + 1000 bytes
    assert main(["replay", str(log), "--backend", "sim", "--resource", "device"]) == 0
    table = capsys.readouterr().out
    assert "replay summary" in table and "5.0 KiB" in table


def test_python_dash_m_mrkit():
    out = subprocess.run([sys.executable, "-m", "mrkit", "info"], capture_output=True, text=True)
    assert out.returncode == 0 and "backend in use" in out.stdout


class _BindingsProxy:
    """cuda.bindings.driver with the memory-advice calls recorded instead of made, shaped like 12.x
    (``*_v2`` take a location) or 13.x (the plain names take a location)."""

    def __init__(self, major):
        from cuda.bindings import driver
        self._real, self.calls = driver, []
        ok = (driver.CUresult.CUDA_SUCCESS,)
        names = ["cuMemAdvise_v2", "cuMemPrefetchAsync_v2"] if major == 12 else ["cuMemAdvise", "cuMemPrefetchAsync"]
        for name in names:
            setattr(self, name, lambda *args, _n=name: (self.calls.append((_n, args)), ok)[1])

    def __getattr__(self, name):
        if name in ("cuMemAdvise_v2", "cuMemPrefetchAsync_v2", "cuMemAdvise", "cuMemPrefetchAsync"):
            raise AttributeError(name)
        return getattr(self._real, name)


@pytest.mark.parametrize("major", [12, 13])
def test_cuda_backend_picks_the_location_form_of_advise_and_prefetch(major):
    drv = CudaDriver()
    proxy = _BindingsProxy(major)
    drv._drv = proxy  # the lazily loaded module: no driver is touched
    entered = []
    drv._ptr_dev = lambda ptr: 3  # the device owning the managed range
    drv._in = lambda dev, fn, args, call, nbytes=None: (entered.append((dev, call)), drv._check(fn(*args), call))[1]
    drv.mem_advise(0x1000, 4096, "set_preferred_location", 0)
    drv.mem_prefetch_async(0x1000, 4096, "host", 7)
    (n1, a1), (n2, a2) = proxy.calls
    assert [dev for dev, _ in entered] == [3, 3]  # both run in the range's device context
    suffix = "_v2" if major == 12 else ""
    assert (n1, n2) == (f"cuMemAdvise{suffix}", f"cuMemPrefetchAsync{suffix}")
    assert a1[3].type == proxy.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE and a1[3].id == 0
    assert a2[2].type == proxy.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST and a2[3:] == (0, 7)
    with pytest.raises(ValueError, match="unsupported advice"):
        drv.mem_advise(0x1000, 4096, "make_it_fast", 0)
    with pytest.raises(ValueError, match="location"):
        drv.mem_prefetch_async(0x1000, 4096, "gpu", 7)


@pytest.mark.parametrize("size", [2**64, 2**64 + 512, 2**70])
def test_a_request_past_size_t_is_the_drivers_out_of_memory_error_not_an_overflow(size):
    """The H100 (real CuPy asking mrkit's pool for 2**64 bytes and more): cuda-bindings cannot convert
    a size past C's ``size_t`` and raised OverflowError out of the pool, where the simulator (and the
    driver, for 2**63) answer out of memory. Every allocating call of the CUDA backend now refuses such
    a size as the driver's OutOfMemoryError, naming the call and the request, before any driver call
    (none is touched here: the bindings module is set without loading the driver)."""
    from cuda.bindings import driver as real
    drv = CudaDriver()
    drv._drv = real
    drv._in = drv._enter = drv._enter_any = None  # a context or a driver call would fail here
    calls = {"cuMemAlloc": lambda: drv.mem_alloc(0, size),
             "cuMemHostAlloc": lambda: drv.mem_host_alloc(size),
             "cuMemAllocManaged": lambda: drv.mem_alloc_managed(0, size),
             "cuMemAllocFromPoolAsync": lambda: drv.mem_alloc_from_pool_async(size, 0, 0),
             "cuMemCreate": lambda: drv.mem_create(0, size),
             "cuMemAddressReserve": lambda: drv.mem_address_reserve(size, 0)}
    for call, fn in calls.items():
        with pytest.raises(mrkit.OutOfMemoryError, match=f"{call}: .* out of memory for a request of {size} bytes") as got:
            fn()
        assert got.value.nbytes == size
    with pytest.raises(OverflowError):  # what the bindings do with it, which no caller should meet
        real.cuMemAllocFromPoolAsync(size, 0, 0)


def test_pool_size_attributes_are_passed_as_cuuint64():
    drv = CudaDriver()
    from cuda.bindings import driver as real
    seen = []

    class P:
        def __getattr__(self, name):
            return getattr(real, name)

        def cuMemPoolSetAttribute(self, pool, attr, value):
            seen.append((attr, value))
            return (real.CUresult.CUDA_SUCCESS,)

    drv._drv = P()
    drv.mem_pool_set_attribute(0x10, "release_threshold", 1 << 40)
    drv.mem_pool_set_attribute(0x10, "reuse_allow_opportunistic", 0)
    (a1, v1), (a2, v2) = seen
    assert isinstance(v1, real.cuuint64_t) and int(v1) == 1 << 40
    assert type(v2) is int and v2 == 0
