"""Resources dropped without ``close()``: what they hold goes back and what they recorded is kept, as
Python's own files and RMM's and CuPy's pools do. The collector may finalize a resource in any thread
at any moment, so nothing here may take another resource's lock inline."""
from __future__ import annotations

import functools
import gc
import io
import weakref

import pytest
from handouts import race

from mrkit import (
    DEFAULT_STREAM, BinningResource, CudaMemoryResource, DeviceMemoryResource, DeviceMemoryResourceOptions,
    LoggingAdaptor, PoolResource, Stream, TrackingAdaptor, VirtualMemoryResource, read_log,
)


def _drop(make):
    """Build with ``make()``, return a weak reference after the last strong one is gone."""
    obj = make()
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is None, "the resource is still referenced somewhere"
    return ref


def _two_events(lg):
    p = lg.allocate(100, DEFAULT_STREAM)
    lg.deallocate(p, 100, DEFAULT_STREAM)
    return lg


def test_a_dropped_log_writes_its_buffered_events_to_its_file(sim, tmp_path):
    path = tmp_path / "mem.csv"
    _drop(lambda: _two_events(LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000,
                                             flush_interval=None)))
    events = read_log(path)
    assert [e.action for e in events] == ["allocate", "free"]


def test_a_dropped_log_in_a_reference_cycle_keeps_its_events(sim, tmp_path):
    path = tmp_path / "mem.csv"

    def make():
        lg = _two_events(LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000, flush_interval=None))
        holder = {"log": lg}
        holder["self"] = holder  # garbage only the collector finds: its file may be finalized first
        return lg

    lg = make()
    ref = weakref.ref(lg)
    del lg
    gc.collect()
    assert ref() is None
    assert [e.action for e in read_log(path)] == ["allocate", "free"]


def test_a_log_the_timer_has_flushed_is_collected_when_dropped(sim, tmp_path):
    import time

    path = tmp_path / "mem.csv"
    lg = _two_events(LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000, flush_interval=0.01))
    deadline = time.monotonic() + 10
    while lg._buf and time.monotonic() < deadline:  # the flusher thread writes the two events
        time.sleep(0.01)
    time.sleep(0.05)  # and goes back to sleep, having looked at this log
    ref = weakref.ref(lg)
    del lg
    gc.collect()
    assert ref() is None, "the flusher thread kept the log alive"
    assert [e.action for e in read_log(path)] == ["allocate", "free"]


def test_a_dropped_log_flushes_into_a_sink_it_does_not_own_and_leaves_it_open(sim):
    sink = io.StringIO()
    _drop(lambda: _two_events(LoggingAdaptor(CudaMemoryResource(0), sink, buffer_lines=1000, flush_interval=None)))
    assert not sink.closed
    assert [e.action for e in read_log(io.StringIO(sink.getvalue()))] == ["allocate", "free"]


# -- caching resources: a dropped pool, binning resource or VMM gives its free memory back -----------

SIZES = (100, 5000, 1 << 20, 3 << 20, 40 << 20)


def _use(mr, streams):
    """Allocate and free on each stream; return nothing live."""
    for s in streams:
        ptrs = [(mr.allocate(n, s), n) for n in SIZES]
        for p, n in ptrs:
            mr.deallocate(p, n, s)


UPSTREAM_KINDS = {"pool": PoolResource, "binning": lambda up: BinningResource(up, "64 KiB")}


@pytest.mark.parametrize("kind", sorted(UPSTREAM_KINDS))
def test_a_dropped_caching_resource_gives_its_chunks_back_upstream(sim, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    streams = [Stream.create(), Stream.create()]

    def make():
        mr = UPSTREAM_KINDS[kind](up)
        _use(mr, streams)
        assert up.outstanding()
        return mr

    _drop(make)
    PoolResource(CudaMemoryResource(0))  # the next caching resource built gives back what was dropped
    assert up.outstanding() == {}
    for s in streams:
        s.close()


def test_a_dropped_pool_keeps_only_the_chunks_that_hold_a_block_still_out(sim):
    up = TrackingAdaptor(CudaMemoryResource(0))
    kept = []

    def make():
        mr = PoolResource(up)
        _use(mr, [DEFAULT_STREAM])
        kept.append(mr.allocate(5000, DEFAULT_STREAM))  # never freed: a dangling pointer of the user's
        assert len(up.outstanding()) >= 2
        return mr

    _drop(make)
    PoolResource(CudaMemoryResource(0))
    assert len(up.outstanding()) == 1
    (base, size), = up.outstanding().items()
    assert base <= kept[0] < base + size


def test_a_dropped_vmm_unmaps_its_pages(sim):
    before = sim.mapped_bytes()

    def make():
        mr = VirtualMemoryResource(0)
        _use(mr, [DEFAULT_STREAM])
        assert sim.mapped_bytes() > before
        return mr

    _drop(make)
    VirtualMemoryResource(0)
    assert sim.mapped_bytes() == before


DROPPED_KINDS = {"pool": PoolResource, "binning": lambda up: BinningResource(up, "64 KiB"),
                 "vmm": lambda up: VirtualMemoryResource(0)}


@pytest.mark.parametrize("kind", sorted(DROPPED_KINDS))
def test_a_dropped_resource_waits_for_work_its_frees_did_not_order(sim, kind):
    """A buffer read on a consumer stream and freed on its own stream without ordering the two (the
    user's race, harmless while the pool keeps the block): the dropped resource's release must not put
    the chunk back upstream (a stream-ordered free) while the read may still run. It waits for the
    device first."""
    up = TrackingAdaptor(DeviceMemoryResource(0))
    s, consumer = Stream.create(), Stream.create()
    mapped = sim.mapped_bytes()

    n = 32 << 10 if kind == "binning" else 3 << 20  # a binned size: a larger one goes upstream at once

    def make():
        mr = DROPPED_KINDS[kind](up)
        p = mr.allocate(n, s)
        sim.memset_async(p, 1, n, s.handle)
        consumer.wait(s)
        sim.touch(p, n, consumer.handle, write=False)  # queued, not yet run
        mr.deallocate(p, n, s)
        return mr

    _drop(make)
    PoolResource(CudaMemoryResource(0))  # gives the dropped one's memory back: no race, nothing unmapped under work
    consumer.synchronize()  # the read runs (on memory still mapped)
    assert up.outstanding() == {}
    assert sim.mapped_bytes() == mapped
    s.close(), consumer.close()


def test_a_dropped_resource_whose_stream_was_closed_gives_its_memory_back(sim):
    up = TrackingAdaptor(CudaMemoryResource(0))

    def make():
        s = Stream.create()
        mr = PoolResource(up)
        p = mr.allocate(1 << 20, s)
        sim.memset_async(p, 1, 1 << 20, s.handle)
        mr.deallocate(p, 1 << 20, s)
        s.close()
        return mr

    _drop(make)
    PoolResource(CudaMemoryResource(0))
    assert up.outstanding() == {}


def test_a_closed_pool_dropped_waits_for_nothing(sim, monkeypatch):
    """close() gave everything back: the drop has nothing to give and must not synchronise the device
    (a pool per task, closed each time, would otherwise stall every next construction)."""
    syncs = []
    monkeypatch.setattr(sim, "ctx_synchronize", lambda *a: syncs.append(a))

    def make():
        mr = PoolResource(CudaMemoryResource(0))
        _use(mr, [DEFAULT_STREAM])
        mr.close()
        return mr

    _drop(make)
    PoolResource(CudaMemoryResource(0))
    assert syncs == []


def test_pools_made_used_and_dropped_by_threads_give_every_byte_back(sim, switch_often):
    """Four threads make, use and drop pools and binning resources while a fifth runs the collector."""
    up = TrackingAdaptor(CudaMemoryResource(0))

    def worker(seed, errors):
        try:
            s = Stream.create()
            for i in range(15):
                mr = PoolResource(up) if (seed + i) % 3 else BinningResource(up, "64 KiB")
                _use(mr, [s, DEFAULT_STREAM])
                del mr  # dropped: the next construction, in this thread or another, gives it back
            s.synchronize()
            s.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    race([functools.partial(worker, k) for k in range(4)], gc.collect, period=0.001)
    gc.collect()
    PoolResource(CudaMemoryResource(0))
    assert up.outstanding() == {}


# -- a driver pool mrkit created ---------------------------------------------------------------------

def test_a_dropped_device_resource_destroys_the_pool_it_created(sim):
    before = set(sim.pools())

    def make():
        mr = DeviceMemoryResource(0, DeviceMemoryResourceOptions(initial_size="1 MiB"))
        p = mr.allocate(4096, DEFAULT_STREAM)
        mr.deallocate(p, 4096, DEFAULT_STREAM)
        assert len(set(sim.pools()) - before) == 1
        return mr

    _drop(make)
    DeviceMemoryResource(0, DeviceMemoryResourceOptions())  # the next pool built destroys the dropped one
    assert len(set(sim.pools()) - before) == 1  # only the new one


def test_a_closed_pool_is_not_destroyed_again_when_dropped(sim):
    """close() destroyed it: the handle may be a new pool's by the time the old object is collected."""
    before = set(sim.pools())

    def make():
        mr = DeviceMemoryResource(0, DeviceMemoryResourceOptions())
        mr.close()
        return mr

    _drop(make)
    kept = DeviceMemoryResource(0, DeviceMemoryResourceOptions())
    PoolResource(CudaMemoryResource(0))
    assert set(sim.pools()) - before == {kept.pool.handle}


# -- on the GPU too: the device wait and the stream-ordered frees are the driver's own ---------------

@pytest.mark.parametrize("kind", ["pool", "binning"])
def test_a_dropped_resource_with_work_queued_gives_every_byte_back_on_either_backend(backend, kind):
    """Blocks written on two streams (the second ordered after the first), freed on the first, the
    resource dropped with that work still queued: the next construction waits for the device and
    every chunk goes back to the driver pool (``cuMemFreeAsync``)."""
    up = TrackingAdaptor(DeviceMemoryResource(0))
    s, consumer = Stream.create(), Stream.create()
    n = 32 << 10 if kind == "binning" else 24 << 20

    def make():
        mr = DROPPED_KINDS[kind](up)
        ptrs = [mr.allocate(n, s) for _ in range(4)]
        for p in ptrs:
            backend.memset_async(p, 3, n, s.handle)
        consumer.wait(s)
        for p in ptrs:
            backend.touch(p, n, consumer.handle, write=False)
            mr.deallocate(p, n, s)  # not ordered after the consumer's reads: the pool keeps the block
        assert up.outstanding()
        return mr

    _drop(make)
    PoolResource(CudaMemoryResource(0))
    assert up.outstanding() == {}
    s.close(), consumer.close()
