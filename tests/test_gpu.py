"""Tests on a real GPU (the cuda backend). Skipped without one; MRKIT_REQUIRE_GPU=1 makes that a failure."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mrkit
from mrkit import (
    DEFAULT_STREAM, CUDAError, DeviceMemoryResource, DeviceMemoryResourceOptions, ManagedMemoryResource,
    OutOfMemoryError, PinnedMemoryResource, PoolResource, Stream, as_stream,
)

pytestmark = pytest.mark.gpu


def test_driver_basics(gpu):
    assert gpu.device_count() >= 1
    assert gpu.device_total_mem(0) > 1 << 30 and gpu.device_name(0)
    assert gpu.device_capability(0, "memory_pools_supported") == 1
    s = Stream.create(0, driver=gpu)
    t = Stream.create(0, driver=gpu)
    assert s.uid != t.uid and s.uid == gpu.stream_get_id(s.handle)
    p = gpu.mem_alloc(0, 1 << 20)
    gpu.memset_async(p, 0x5A, 1 << 20, s.handle)
    ev = s.record()
    t.wait(ev)
    gpu.copy_from_host(p + 10, b"hello", t.handle)
    assert gpu.copy_to_host(p, 16, t.handle) == b"\x5a" * 10 + b"hello" + b"\x5a"
    info = gpu.pointer_info(p)
    assert info["memory_type"] == "device" and info["range_start"] == p and info["range_size"] == 1 << 20
    gpu.mem_free(p)
    ev.close()
    s.close()
    t.close()


def test_errors_carry_driver_names(gpu):
    with pytest.raises(CUDAError) as e:
        gpu.mem_free(0xDEADBEEF000)
    assert e.value.name == "CUDA_ERROR_INVALID_VALUE" and e.value.code == 1 and e.value.call == "cuMemFree"
    with pytest.raises(OutOfMemoryError, match="cuMemAlloc"):
        gpu.mem_alloc(0, 1 << 52)
    with pytest.raises(CUDAError) as e:
        gpu.device_name(999)
    assert e.value.name == "CUDA_ERROR_INVALID_DEVICE"


def test_managed_advise_and_prefetch_on_this_bindings_version(gpu):
    mr = ManagedMemoryResource(0, driver=gpu)
    s = Stream.create(0, driver=gpu)
    p = mr.allocate(1 << 20, s)
    for advice, loc in (("set_read_mostly", 0), ("set_preferred_location", 0), ("set_accessed_by", 0),
                        ("unset_read_mostly", 0), ("set_preferred_location", "host")):
        mr.advise(p, 1 << 20, advice, loc)
    mr.prefetch(p, 1 << 20, 0, s)
    mr.prefetch(p, 1 << 20, "host", s)
    gpu.memset_async(p, 7, 1 << 20, s.handle)
    assert gpu.copy_to_host(p, 4, s.handle) == b"\x07" * 4
    mr.deallocate(p, 1 << 20, s)
    s.close()


def test_pinned_memory_is_device_accessible(gpu):
    mr = PinnedMemoryResource(driver=gpu)
    p = mr.allocate(4096, DEFAULT_STREAM)
    gpu.memset_async(p, 3, 4096, 0)
    gpu.stream_synchronize(0)
    import ctypes
    assert ctypes.string_at(p, 4) == b"\x03" * 4  # written by the device, read by the host
    assert gpu.pointer_info(p)["memory_type"] == "host"
    mr.deallocate(p, 4096, DEFAULT_STREAM)


def test_owned_pool_attributes_trim_and_watermarks(gpu):
    opts = DeviceMemoryResourceOptions(initial_size="64 MiB", release_threshold="1 GiB")
    mr = DeviceMemoryResource(0, opts, driver=gpu)
    pool = mr.pool
    attrs = pool.attributes
    assert attrs["reserved_mem_current"] >= 64 << 20 and attrs["release_threshold"] == 1 << 30
    s = Stream.create(0, driver=gpu)
    ps = [mr.allocate(8 << 20, s) for _ in range(4)]
    assert pool.used_mem_current >= 32 << 20
    for p in ps:
        mr.deallocate(p, 8 << 20, s)
    s.synchronize()
    pool.reset_high_watermarks()
    assert pool.used_mem_high == pool.used_mem_current
    mr.trim()
    assert pool.reserved_mem_current == 0
    mr.close()
    s.close()
    with pytest.raises(ValueError, match="process_wide"):
        DeviceMemoryResource(0, driver=gpu).pool.set_attribute("release_threshold", 0)


def test_vmm_driver_sequence(gpu):
    g = gpu.mem_get_allocation_granularity(0)
    va = gpu.mem_address_reserve(4 * g)
    h = gpu.mem_create(0, 2 * g)
    gpu.mem_map(va, 2 * g, 0, h)
    gpu.mem_set_access(va, 2 * g, 0)
    gpu.memset_async(va, 9, 2 * g, 0)
    assert gpu.copy_to_host(va + g, 4, 0) == b"\x09" * 4
    with pytest.raises(CUDAError) as e:
        gpu.mem_unmap(va, g)  # a sub-range of a mapping
    assert e.value.name == "CUDA_ERROR_INVALID_VALUE"
    gpu.mem_unmap(va, 2 * g)
    gpu.mem_release(h)
    gpu.mem_address_free(va, 4 * g)


_CHILD = r"""
import sys
from mrkit import MemoryPool
from mrkit.driver import CudaDriver
drv = CudaDriver()
drv.ensure_context(0)
fd, data, n = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3])
pool = MemoryPool.from_shareable_handle(fd, driver=drv)
ptr = pool.import_pointer(data)
seen = drv.copy_to_host(ptr, n, 0)
drv.memset_async(ptr, 0x77, n, 0)
drv.stream_synchronize(0)
drv.mem_free(ptr)
print(seen.hex())
"""


def test_ipc_between_two_processes(gpu):
    mr = DeviceMemoryResource(0, DeviceMemoryResourceOptions(ipc_handle_type="posix_fd"), driver=gpu)
    n = 1 << 16
    p = mr.allocate(n, DEFAULT_STREAM)
    gpu.memset_async(p, 0x42, n, 0)
    gpu.stream_synchronize(0)
    fd = mr.pool.export_handle()
    data = mr.pool.export_pointer(p)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(fd), data.hex(), str(n)], pass_fds=(fd,),
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert bytes.fromhex(out.stdout.strip()) == b"\x42" * n  # the child read our data
    assert gpu.copy_to_host(p, 8, 0) == b"\x77" * 8  # and we see what it wrote
    os.close(fd)
    mr.deallocate(p, n, DEFAULT_STREAM)
    gpu.stream_synchronize(0)
    mr.close()


def test_foreign_streams_from_cupy_and_torch(gpu):
    cupy = pytest.importorskip("cupy")
    cs = cupy.cuda.Stream(non_blocking=True)
    ms = as_stream(cs)
    assert ms.handle == cs.ptr and ms.uid == gpu.stream_get_id(cs.ptr) and as_stream(cs).uid == ms.uid
    torch = pytest.importorskip("torch")
    ts = torch.cuda.Stream()
    mt = as_stream(ts)
    assert mt.handle == ts.cuda_stream and mt.uid != ms.uid


@pytest.mark.parametrize("upstream", ["device", "cuda"])
def test_multistream_cupy_fills_never_corrupt(gpu, upstream):
    """8 streams, cross-stream frees, real kernels: every block keeps what its stream wrote."""
    cupy = pytest.importorskip("cupy")
    import random
    base = DeviceMemoryResource(0, driver=gpu) if upstream == "device" else mrkit.CudaMemoryResource(0, driver=gpu)
    mr = PoolResource(base)
    streams = [Stream.create(0, driver=gpu) for _ in range(8)]
    cstreams = [cupy.cuda.Stream.from_external(s) for s in streams]  # mrkit streams speak __cuda_stream__
    rng = random.Random(5)
    live = []  # (ptr, n, stream index, value)

    def view(p, n):
        mem = cupy.cuda.UnownedMemory(p, n, mr, 0)
        return cupy.ndarray((n // 4,), dtype=cupy.int32, memptr=cupy.cuda.MemoryPointer(mem, 0))

    checked = 0
    for step in range(3000):
        if live and rng.random() < 0.5:
            p, n, i, v = live.pop(rng.randrange(len(live)))
            with cstreams[i]:
                assert int((view(p, n) != v).sum()) == 0, f"block {p:#x} was corrupted"
            checked += 1
            j = rng.randrange(8)
            if j != i:  # free on another stream, ordered after the owner's work
                streams[j].wait(streams[i])
            mr.deallocate(p, n, streams[j])
        else:
            i = rng.randrange(8)
            n = 4 * rng.randint(1, 1 << 18)
            p = mr.allocate(n, streams[i])
            with cstreams[i]:
                a = view(p, n)
                a.fill(step)
                a += 0  # a second kernel keeps the stream busy
            live.append((p, n, i, step))
    for p, n, i, v in live:
        with cstreams[i]:
            assert int((view(p, n) != v).sum()) == 0
        mr.deallocate(p, n, streams[i])
    for s in streams:
        s.synchronize()
    assert checked > 1000 and mr.live_bytes == 0
    mr.release()
    for s in streams:
        s.close()


def test_info_on_the_gpu(gpu, capsys):
    from mrkit._cli import main
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "CUDA driver:" in out and "[0]" in out and "memory pools (stream-ordered allocator): yes" in out


def test_vmm_growth_trim_regrowth_on_the_gpu(gpu):
    MiB = 1 << 20
    mr = mrkit.VirtualMemoryResource(0, mrkit.VirtualMemoryResourceOptions(reserve_size="64 GiB"), driver=gpu)
    s = Stream.create(0, driver=gpu)
    a = mr.allocate(3 * MiB, s)
    b = mr.allocate(5 * MiB, s)
    assert b == a + 3 * MiB and mr.mapped_bytes == 8 * MiB
    gpu.memset_async(a, 1, 3 * MiB, s.handle)
    gpu.memset_async(b, 2, 5 * MiB, s.handle)
    free0 = gpu.mem_get_info(0)[0]
    mr.deallocate(b, 5 * MiB, s)
    assert mr.trim() == 4 * MiB and mr.mapped_bytes == 4 * MiB
    assert gpu.mem_get_info(0)[0] >= free0 + 4 * MiB - (2 * MiB)  # physical memory went back
    assert gpu.copy_to_host(a, 4, s.handle) == b"\x01" * 4
    c = mr.allocate(5 * MiB, s)
    gpu.memset_async(c, 3, 5 * MiB, s.handle)
    assert gpu.copy_to_host(c + 5 * MiB - 4, 4, s.handle) == b"\x03" * 4 and mr.mapped_bytes == 8 * MiB
    mr.deallocate(c, 5 * MiB, s)
    mr.deallocate(a, 3 * MiB, s)
    assert mr.trim() == 8 * MiB and mr.mapped_bytes == 0
    mr.close()
    s.close()


def test_vmm_exportable_pages_on_the_gpu(gpu):
    """handle_type='posix_fd' makes cuMemCreate request exportable allocations; the memory works."""
    MiB = 1 << 20
    opts = mrkit.VirtualMemoryResourceOptions(reserve_size="4 GiB", handle_type="posix_fd", location=0)
    mr = mrkit.VirtualMemoryResource(0, opts, driver=gpu)
    s = Stream.create(0, driver=gpu)
    a = mr.allocate(6 * MiB, s)
    gpu.memset_async(a, 9, 6 * MiB, s.handle)
    assert gpu.copy_to_host(a + 6 * MiB - 4, 4, s.handle) == b"\x09" * 4 and mr.mapped_bytes == 6 * MiB
    mr.deallocate(a, 6 * MiB, s)
    assert mr.trim() == 6 * MiB
    mr.close()
    s.close()


def test_vmm_moves_free_pages_on_the_gpu(gpu):
    """footprint_limit on the driver: a free hole's physical allocation is unmapped and mapped into
    a new block (after the stream that freed it is waited for); data written before and after stays."""
    MiB = 1 << 20
    opts = mrkit.VirtualMemoryResourceOptions(reserve_size="4 GiB", footprint_limit=1.0)
    mr = mrkit.VirtualMemoryResource(0, opts, driver=gpu)
    s, t = Stream.create(0, driver=gpu), Stream.create(0, driver=gpu)
    a = mr.allocate(8 * MiB, s)
    b = mr.allocate(2 * MiB, s)
    gpu.memset_async(a, 4, 8 * MiB, s.handle)
    gpu.memset_async(b, 5, 2 * MiB, s.handle)
    mr.deallocate(a, 8 * MiB, s)
    c = mr.allocate(10 * MiB, t)  # moves a's 8 MiB allocation above b, creates one page
    assert c == b + 2 * MiB and mr.moves == 1 and mr.physical_bytes == 12 * MiB
    gpu.memset_async(c, 6, 10 * MiB, t.handle)
    assert gpu.copy_to_host(c, 4, t.handle) == b"\x06" * 4
    assert gpu.copy_to_host(c + 10 * MiB - 4, 4, t.handle) == b"\x06" * 4
    assert gpu.copy_to_host(b + 2 * MiB - 4, 4, s.handle) == b"\x05" * 4
    d = mr.allocate(8 * MiB, s)  # the hole again, with new pages
    gpu.memset_async(d, 7, 8 * MiB, s.handle)
    assert gpu.copy_to_host(d + 8 * MiB - 4, 4, s.handle) == b"\x07" * 4
    assert gpu.copy_to_host(c + 4, 4, t.handle) == b"\x06" * 4
    for p, n, st in ((b, 2, s), (c, 10, t), (d, 8, s)):
        mr.deallocate(p, n * MiB, st)
    assert mr.trim() == 20 * MiB and mr.physical_bytes == 0
    mr.close()
    s.close()
    t.close()


def test_mrkit_leaves_the_callers_context_as_it_found_it(gpu):
    """A thread with no current context (every new thread) can use a pool on the default stream,
    release it, allocate pinned memory and reserve addresses, and still has no context afterwards;
    a thread whose context another library made current keeps exactly that context."""
    import threading

    from cuda.bindings import driver as cu

    def current():
        err, ctx = cu.cuCtxGetCurrent()
        assert err == cu.CUresult.CUDA_SUCCESS
        return int(ctx)

    mr = PoolResource(DeviceMemoryResource(0, driver=gpu), initial_size="8 MiB")
    pinned = PinnedMemoryResource(driver=gpu)
    seen, errors = [], []

    def fresh_thread():
        try:
            before = current()
            p = mr.allocate(1 << 20, DEFAULT_STREAM)
            mr.deallocate(p, 1 << 20, DEFAULT_STREAM)
            q = mr.allocate(3 << 20, Stream.create(0, driver=gpu))  # a hand-over and a release
            mr.deallocate(q, 3 << 20, DEFAULT_STREAM)
            mr.release()
            h = pinned.allocate(4096, DEFAULT_STREAM)
            pinned.deallocate(h, 4096, DEFAULT_STREAM)
            seen.append((before, current()))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert not errors, errors[0]
    assert seen == [(0, 0)]  # no context before, none after: mrkit switched nothing behind the thread
    # a thread that has a context (device 0's primary, as CuPy and PyTorch make it) keeps it
    gpu.ensure_context(0)
    mine = current()
    p = mr.allocate(1 << 20, DEFAULT_STREAM)
    mr.deallocate(p, 1 << 20, DEFAULT_STREAM)
    assert current() == mine != 0
    mr.close()
