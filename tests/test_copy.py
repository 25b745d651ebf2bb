"""Copying and pickling. Whatever owns memory or a driver handle (resources, adaptors, driver pools,
streams, events) is shared by reference under ``copy.copy``/``copy.deepcopy`` and refuses pickling
with a ``TypeError`` naming its class: a second object owning the same block, chunk or handle would
give it back a second time (for a block, after it may have been handed to someone else). A
``Buffer`` copies by value: a new block from the same resource holding the same bytes, the copy
ordered on the stream. Runs on the simulator; the Buffer cases also on the GPU."""
from __future__ import annotations

import copy
import ctypes
import gc
import pickle

import pytest

from mrkit import (
    DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM, CudaMemoryResource, Event, HostMemoryResource, MemoryPool,
    PinnedMemoryResource, PoolResource, Stream, TrackingAdaptor, VirtualMemoryResource, using,
)
from test_bad_input_table import RESOURCES, _state

PROTOCOLS = sorted({0, 2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL})


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_a_copied_resource_is_the_resource_itself(sim, kind):
    mr = RESOURCES[kind]()
    ptr = mr.allocate(4096, DEFAULT_STREAM)
    before = _state(mr)
    assert copy.copy(mr) is mr
    assert copy.deepcopy(mr) is mr
    # a container holding a resource still copies, and shares the resource
    config = {"mr": mr, "sizes": [1, 2, 3]}
    clone = copy.deepcopy(config)
    assert clone["mr"] is mr and clone["sizes"] == [1, 2, 3] and clone["sizes"] is not config["sizes"]
    assert _state(mr) == before
    mr.deallocate(ptr, 4096, DEFAULT_STREAM)


@pytest.mark.parametrize("kind", sorted(RESOURCES))
def test_pickling_a_resource_is_refused_naming_it(sim, kind):
    mr = RESOURCES[kind]()
    ptr = mr.allocate(4096, DEFAULT_STREAM)
    before = _state(mr)
    for protocol in PROTOCOLS:
        with pytest.raises(TypeError, match=f"cannot pickle a {type(mr).__name__}.*resource_from_spec"):
            pickle.dumps(mr, protocol)
        with pytest.raises(TypeError, match=type(mr).__name__):
            pickle.dumps({"nested": [mr]}, protocol)
    assert _state(mr) == before
    mr.deallocate(ptr, 4096, DEFAULT_STREAM)


def test_a_copied_owning_stream_is_closed_once(sim):
    s = Stream.create()
    assert copy.copy(s) is s and copy.deepcopy(s) is s
    s.close()
    other = Stream.create()  # the simulator may hand out the destroyed handle again
    copy.copy(s).close()  # the same object: already closed, nothing destroyed twice
    assert other.alive is True
    other.close()


def test_copied_events_and_driver_pools_are_themselves(sim):
    ev = Event.create()
    assert copy.copy(ev) is ev and copy.deepcopy(ev) is ev
    ev.close()
    pool = MemoryPool.create()
    assert copy.copy(pool) is pool and copy.deepcopy(pool) is pool
    pool.close()


def test_streams_events_and_pools_refuse_pickling_but_default_streams_round_trip(sim):
    s, ev, pool = Stream.create(), Event.create(), MemoryPool.create()
    for obj in (s, ev, pool):
        with pytest.raises(TypeError, match=f"cannot pickle a {type(obj).__name__}"):
            pickle.dumps(obj)
    for default in (DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM):
        for protocol in PROTOCOLS:
            assert pickle.loads(pickle.dumps(default, protocol)) is default
        assert copy.copy(default) is default and copy.deepcopy(default) is default
    s.close(), ev.close(), pool.close()


def _fill(buf, data: bytes, drv) -> None:
    if buf.resource.device_accessible:
        drv.copy_from_host(buf.ptr, data, buf.stream.handle)
    else:
        ctypes.memmove(buf.ptr, data, len(data))


def _read(buf, drv) -> bytes:
    if buf.resource.device_accessible:
        return drv.copy_to_host(buf.ptr, buf.size, buf.stream.handle)
    return ctypes.string_at(buf.ptr, buf.size)


BUFFER_RESOURCES = {
    "cuda": lambda: TrackingAdaptor(CudaMemoryResource(0)),
    "pool": lambda: TrackingAdaptor(PoolResource(CudaMemoryResource(0))),
    "vmm": lambda: TrackingAdaptor(VirtualMemoryResource(0)),
    "pinned": lambda: TrackingAdaptor(PinnedMemoryResource()),
    "host": lambda: TrackingAdaptor(HostMemoryResource()),
}


@pytest.mark.parametrize("kind", sorted(BUFFER_RESOURCES))
@pytest.mark.parametrize("how", ["copy", "deepcopy", "method"])
def test_a_copied_buffer_owns_a_new_block_with_the_same_bytes(backend, kind, how):
    mr = BUFFER_RESOURCES[kind]()
    data = bytes(range(256)) * 40 + b"tail"
    buf = mr.allocate_buffer(len(data))
    _fill(buf, data, backend)
    dup = {"copy": copy.copy, "deepcopy": copy.deepcopy, "method": lambda b: b.copy()}[how](buf)
    assert dup is not buf and dup.ptr != buf.ptr
    assert (dup.size, dup.resource, dup.stream, dup.alignment) == (buf.size, buf.resource, buf.stream, buf.alignment)
    assert sorted(mr.outstanding()) == sorted([buf.ptr, dup.ptr])
    buf.close()
    # the copy's bytes are its own: the original's block may be reused and overwritten
    again = mr.allocate_buffer(len(data))
    _fill(again, b"\xee" * len(data), backend)
    assert _read(dup, backend) == data
    del buf
    gc.collect()
    assert sorted(mr.outstanding()) == sorted([dup.ptr, again.ptr])
    dup.close(), again.close()
    assert mr.outstanding() == {}


def test_a_buffer_copy_on_another_stream_waits_for_the_source_stream(sim):
    mr = TrackingAdaptor(CudaMemoryResource(0))
    a, b = Stream.create(), Stream.create()
    buf = mr.allocate_buffer(4096, a)
    sim.memset_async(buf.ptr, 7, 4096, a.handle)  # still queued on a: the simulator runs work when asked
    dup = buf.copy(b)
    assert dup.stream == b
    # unordered, the simulator's checker raises StreamOrderViolation on this read (a's write races it)
    assert _read(dup, sim) == b"\x07" * 4096
    buf.close(), dup.close(), a.close(), b.close()
    assert mr.outstanding() == {}


def test_copying_a_closed_buffer_or_one_whose_resource_refuses_leaves_nothing(sim):
    mr = TrackingAdaptor(CudaMemoryResource(0))
    buf = mr.allocate_buffer(4096)
    buf.close()
    with pytest.raises(ValueError, match="closed"):
        copy.copy(buf)
    from mrkit import LimitingAdaptor, OutOfMemoryError

    lim = TrackingAdaptor(LimitingAdaptor(CudaMemoryResource(0), 6000))
    one = lim.allocate_buffer(4096)
    with pytest.raises(OutOfMemoryError):
        one.copy()
    assert list(lim.outstanding()) == [one.ptr]
    one.close()


def test_a_buffer_pickles_by_value_into_the_current_resource(sim):
    src = TrackingAdaptor(PoolResource(CudaMemoryResource(0)))
    dst = TrackingAdaptor(CudaMemoryResource(0))
    data = b"mrkit" * 1000
    buf = src.allocate_buffer(len(data))
    _fill(buf, data, sim)
    with using(dst):
        back = pickle.loads(pickle.dumps(buf))
    assert back.resource is dst and back.size == len(data) and back.stream is DEFAULT_STREAM
    assert _read(back, sim) == data
    assert list(dst.outstanding()) == [back.ptr] and list(src.outstanding()) == [buf.ptr]
    back.close(), buf.close()
    with pytest.raises(ValueError, match="closed"):
        pickle.dumps(buf)
