"""``with resource as mr:``: every resource that owns memory or a driver pool closes at the end of the
block, as mrkit's streams, events and buffers do. Leaving normally with allocations still live is the
``ValueError`` of ``close()``; leaving by an exception keeps that exception (the live blocks it
interrupted stay valid and go back when they are freed or the resource is dropped)."""
from __future__ import annotations

import functools
import gc

import pytest
from handouts import in_threads

from mrkit import (
    DEFAULT_STREAM, BinningResource, CudaMemoryResource, DeviceMemoryResource, DeviceMemoryResourceOptions,
    LoggingAdaptor, PoolResource, Stream, TrackingAdaptor, VirtualMemoryResource, read_log,
)

SIZES = (100, 5000, 1 << 20, 3 << 20)  # binned and (above max_bin) served upstream
KINDS = {
    "pool": PoolResource,
    "binning": lambda up: BinningResource(up, "64 KiB"),
}


def _use(mr, stream=DEFAULT_STREAM):
    ptrs = [(mr.allocate(n, stream), n) for n in SIZES]
    for p, n in ptrs:
        mr.deallocate(p, n, stream)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_caching_resource_used_in_a_with_block_gives_every_byte_back_upstream(backend, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    with KINDS[kind](up) as mr:
        _use(mr)
        assert up.outstanding()
    assert up.outstanding() == {}


def test_a_vmm_used_in_a_with_block_unmaps_and_frees_its_reservation(sim):
    mapped = sim.mapped_bytes()
    with VirtualMemoryResource(0) as mr:
        _use(mr)
        assert sim.mapped_bytes() > mapped
    assert sim.mapped_bytes() == mapped
    with pytest.raises(Exception):  # the reservation is gone: nothing is served from it any more
        mr.allocate(100, DEFAULT_STREAM)


def test_an_owned_device_pool_used_in_a_with_block_is_destroyed(sim):
    before = set(sim.pools())
    with DeviceMemoryResource(0, options=DeviceMemoryResourceOptions()) as mr:
        _use(mr)
        assert len(set(sim.pools()) - before) == 1
    assert set(sim.pools()) == before


def test_an_owned_device_pool_in_a_with_block_is_destroyed_once_on_either_backend(backend, monkeypatch):
    destroyed = []
    real = backend.mem_pool_destroy
    monkeypatch.setattr(backend, "mem_pool_destroy", lambda h: (destroyed.append(h), real(h))[1])
    with DeviceMemoryResource(0, options=DeviceMemoryResourceOptions()) as mr:
        _use(mr)
        assert destroyed == []
    assert destroyed == [mr.pool.handle]
    mr.close()
    del mr
    gc.collect()
    PoolResource(CudaMemoryResource(0))  # runs what dropped resources queued: nothing for this pool
    assert len(destroyed) == 1


def test_the_current_device_pool_is_left_alone_by_a_with_block(sim):
    before = set(sim.pools())
    with DeviceMemoryResource(0) as mr:
        _use(mr)
    assert set(sim.pools()) == before
    _use(mr)  # the process's pool: still usable


def test_a_log_used_in_a_with_block_is_written_and_closed(sim, tmp_path):
    path = tmp_path / "mem.csv"
    with LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000, flush_interval=None) as lg:
        _use(lg)
    assert lg.closed
    assert len(read_log(path)) == 2 * len(SIZES)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_leaving_a_with_block_with_a_live_allocation_is_the_close_error(backend, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    with pytest.raises(ValueError, match="1 live allocation"):
        with KINDS[kind](up) as mr:
            p = mr.allocate(5000, DEFAULT_STREAM)
    mr.deallocate(p, 5000, DEFAULT_STREAM)  # the block stayed valid; once freed, close() succeeds
    mr.close()
    assert up.outstanding() == {}


@pytest.mark.parametrize("kind", sorted(KINDS) + ["vmm"])
def test_an_exception_leaving_a_with_block_is_not_replaced_by_the_close_error(backend, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    make = (lambda: VirtualMemoryResource(0)) if kind == "vmm" else (lambda: KINDS[kind](up))
    with pytest.raises(KeyError, match="the user's own"):
        with make() as mr:
            p = mr.allocate(5000, DEFAULT_STREAM)
            raise KeyError("the user's own")
    mr.deallocate(p, 5000, DEFAULT_STREAM)
    mr.close()
    assert up.outstanding() == {}


def test_a_binning_resource_refuses_close_while_a_large_allocation_is_live(sim):
    up = TrackingAdaptor(CudaMemoryResource(0))
    mr = BinningResource(up, "64 KiB")
    p = mr.allocate(1 << 20, DEFAULT_STREAM)  # above max_bin: the upstream's
    with pytest.raises(ValueError, match="live allocation"):
        mr.close()
    assert len(up.outstanding()) == 1  # nothing changed
    mr.deallocate(p, 1 << 20, DEFAULT_STREAM)
    mr.close()
    assert up.outstanding() == {}


def test_threads_using_pools_in_with_blocks_give_every_byte_back(sim, switch_often):
    up = TrackingAdaptor(CudaMemoryResource(0))
    shared = PoolResource(up)

    def worker(seed, errors):
        try:
            s = Stream.create()
            for i in range(20):
                with KINDS[("pool", "binning")[(seed + i) % 2]](up) as mr:
                    _use(mr, s)
                _use(shared, s)
            s.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    in_threads([functools.partial(worker, k) for k in range(4)])
    shared.close()
    assert up.outstanding() == {}


@pytest.mark.parametrize("kind", sorted(KINDS) + ["vmm"])
def test_a_closed_caching_resource_refuses_to_allocate_and_holds_nothing(backend, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    mr = VirtualMemoryResource(0) if kind == "vmm" else KINDS[kind](up)
    with mr:
        _use(mr)
    for n in SIZES:  # binned, served upstream, and the VMM's pages alike
        with pytest.raises(ValueError, match="is closed"):
            mr.allocate(n, DEFAULT_STREAM)
    assert up.outstanding() == {} and mr.live_bytes == 0
    assert mr.allocate(0, DEFAULT_STREAM) == 0
    mr.close()  # again: nothing to do


def test_closing_a_device_resource_with_a_live_allocation_is_refused_and_changes_nothing(backend):
    """As every resource's close() does: a pool is not destroyed under blocks still in use (the driver
    allows it and frees them as they are freed; the one GPU crash of the eighteenth session came at the
    first cuCtxSynchronize after a test that did so, cause not established). Nothing changes."""
    mr = DeviceMemoryResource(0, options=DeviceMemoryResourceOptions())
    p = mr.allocate(5000, DEFAULT_STREAM)
    with pytest.raises(ValueError, match="1 live allocation"):
        mr.close()
    with pytest.raises(ValueError, match="1 live allocation"):
        with mr:
            pass
    assert not mr.pool._closed and mr.outstanding() == {p: 5000}
    q = mr.allocate(100, DEFAULT_STREAM)  # still serving
    for ptr, n in ((p, 5000), (q, 100)):
        mr.deallocate(ptr, n, DEFAULT_STREAM)
    mr.close()
    assert mr.pool._closed


def test_a_closed_device_resource_refuses_the_destroyed_pool(backend):
    mr = DeviceMemoryResource(0, options=DeviceMemoryResourceOptions())
    p = mr.allocate(5000, DEFAULT_STREAM)
    mr.deallocate(p, 5000, DEFAULT_STREAM)
    pool = mr.pool
    mr.close()
    with pytest.raises(ValueError, match="is closed"):
        mr.allocate(5000, DEFAULT_STREAM)
    for call in (pool.trim_to, lambda: pool.get_attribute("used_mem_current"), lambda: pool.reserved_mem_current,
                 lambda: pool.set_attribute("release_threshold", 0), pool.reset_high_watermarks,
                 lambda: pool.access_from(0), pool.export_handle, mr.trim):
        with pytest.raises(ValueError, match="is closed"):
            call()
    assert mr.outstanding() == {}


def test_a_pool_closed_by_itself_waits_for_the_frees_and_refuses_while_memory_is_in_use(sim):
    """``MemoryPool.close()`` knows no table of blocks: it waits for the device (frees still queued
    complete) and refuses, destroying nothing, while the driver counts memory of the pool in use."""
    mr = DeviceMemoryResource(0, options=DeviceMemoryResourceOptions())
    s = Stream.create()
    p = mr.allocate(5000, s)
    with pytest.raises(ValueError, match="in use"):
        mr.pool.close()
    assert not mr.pool._closed
    mr.deallocate(p, 5000, s)  # queued on s, not yet run by the simulator
    mr.pool.close()
    assert mr.pool._closed and mr.pool.handle not in sim.pools()
    s.close()
