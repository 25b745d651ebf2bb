"""An allocation on a stream mrkit knows is gone (an owning ``Stream`` closed, a CuPy/PyTorch stream whose
owner was collected) is a ``ValueError`` naming the stream wherever it would reach the driver: a
destroyed handle given to ``cuStreamWaitEvent`` or ``cuMemAllocFromPoolAsync`` is undefined behaviour
on a real device (the simulator calls it an invalid handle). Nothing changes: the free memory stays
where it was, and every byte goes back upstream at the end. Frees on a closed stream stay valid (its
work still completes; mrkit waits for it)."""
from __future__ import annotations

import functools

import pytest
from handouts import in_threads

from mrkit import (
    DEFAULT_STREAM, BinningResource, CudaMemoryResource, DeviceMemoryResource, PoolResource, Stream,
    TrackingAdaptor, VirtualMemoryResource,
)

KINDS = {
    "pool": lambda up: PoolResource(up),
    "binning": lambda up: BinningResource(up, "64 KiB"),
    "vmm": lambda up: VirtualMemoryResource(0),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_taking_another_streams_free_memory_for_a_closed_stream_is_refused(backend, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    mr = KINDS[kind](up)
    a, b = Stream.create(), Stream.create()
    p = mr.allocate(1000, a)
    mr.deallocate(p, 1000, a)
    b.close()
    with pytest.raises(ValueError, match=r"stream .* is closed"):
        mr.allocate(1000, b)  # a's block would be handed over behind an event b can no longer wait for
    q = mr.allocate(1000, a)  # nothing moved: a's free block is still a's
    assert q == p
    mr.deallocate(q, 1000, a)
    a.close()
    mr.close()
    assert up.outstanding() == {}


@pytest.mark.parametrize("kind", ["pool", "binning"])
def test_growing_from_the_upstream_for_a_closed_stream_is_refused(backend, kind):
    up = TrackingAdaptor(DeviceMemoryResource(0))
    mr = KINDS[kind](up)
    s = Stream.create()
    s.close()
    with pytest.raises(ValueError, match=r"stream .* is closed"):
        mr.allocate(1000, s)
    assert up.outstanding() == {} and mr.pool_size == 0
    mr.close()


def test_a_driver_pool_refuses_a_closed_stream(backend):
    mr = DeviceMemoryResource(0)
    s = Stream.create()
    s.close()
    with pytest.raises(ValueError, match=r"stream .* is closed"):
        mr.allocate(1000, s)
    assert mr.outstanding() == {}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_free_on_a_closed_stream_is_still_taken(backend, kind):
    up = TrackingAdaptor(CudaMemoryResource(0))
    mr = KINDS[kind](up)
    s = Stream.create()
    p = mr.allocate(5000, s)
    s.close()
    mr.deallocate(p, 5000, s)
    q = mr.allocate(5000, DEFAULT_STREAM)
    mr.deallocate(q, 5000, DEFAULT_STREAM)
    mr.close()
    assert up.outstanding() == {}


def test_threads_whose_streams_close_under_them_lose_nothing(sim, switch_often):
    """Each thread allocates on its own stream and others' frees keep moving memory around; a stream is
    closed while its thread may still be allocating on it: every allocation either succeeds or is the
    ValueError, and every byte goes back upstream."""
    up = TrackingAdaptor(CudaMemoryResource(0))
    mr = PoolResource(up)
    refused = []

    def worker(k, errors):
        s = Stream.create()
        held = []
        try:
            for i in range(200):
                if i == 100 + 10 * k:
                    s.close()
                n = 256 * (1 + (i * 7 + k) % 13) if i < 100 else 65536 * i  # growing: its own list misses
                try:
                    held.append((mr.allocate(n, s), n))
                except ValueError as exc:
                    assert "is closed" in str(exc)
                    refused.append(k)
                if len(held) > 4:
                    p, n = held.pop(0)
                    mr.deallocate(p, n, s)
            for p, n in held:
                mr.deallocate(p, n, s)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    in_threads([functools.partial(worker, k) for k in range(4)])
    assert refused  # the closed streams' allocations did reach the driver-facing path
    mr.close()
    assert up.outstanding() == {}


def test_a_closed_streams_and_events_handles_never_reach_the_driver(backend):
    s, t = Stream.create(), Stream.create()
    ev = s.record()
    s.close()
    for call in (s.synchronize, s.query, s.record, lambda: s.wait(t), lambda: t.wait(s), lambda: s.wait(ev),
                 lambda: ev.record(s)):
        with pytest.raises(ValueError, match=r"stream .* is closed"):
            call()
    ev.close()
    for call in (ev.query, ev.synchronize, lambda: ev.record(t), lambda: t.wait(ev)):
        with pytest.raises(ValueError, match=r"Event .* is closed"):
            call()
    t.synchronize()  # the live stream still works
    t.close()


def test_a_prefetch_on_a_closed_stream_is_refused(sim):
    from mrkit import ManagedMemoryResource
    mr = ManagedMemoryResource(0)
    p = mr.allocate(4096, DEFAULT_STREAM)
    s = Stream.create()
    s.close()
    with pytest.raises(ValueError, match=r"stream .* is closed"):
        mr.prefetch(p, 4096, 0, s)
    mr.deallocate(p, 4096, DEFAULT_STREAM)


def test_a_buffer_whose_stream_was_closed_still_reads_copies_exports_and_frees(backend):
    """``with Stream.create() as s: buf = mr.allocate_buffer(n, s); ...`` then using ``buf`` after the
    block: the buffer's stream is gone, so mrkit waits for the device (its work may still run) and uses
    the default stream in its place, never the destroyed handle."""
    from mrkit import Buffer
    up = TrackingAdaptor(CudaMemoryResource(0))
    mr = PoolResource(up)
    data = bytes(range(256)) * 16
    with Stream.create() as s:
        buf = Buffer.from_bytes(data, mr, s)
    assert buf.stream is s and s.alive is False
    assert buf.tobytes() == data
    dup = buf.copy()
    assert dup.tobytes() == data and dup.ptr != buf.ptr
    cai = buf.__cuda_array_interface__
    assert cai["stream"] == 1  # the legacy default stream stands in for the destroyed one
    t = Stream.create()
    capsule = buf.__dlpack__(stream=t.handle)  # the consumer's stream ordered after the device's work
    del capsule
    assert buf.copy(t).tobytes(t) == data
    for b in (buf, dup):
        b.close()
    t.synchronize()
    t.close()
    mr.close()
    assert up.outstanding() == {}


def test_a_buffer_asked_to_use_a_closed_stream_is_refused(backend):
    from mrkit import Buffer
    mr = PoolResource(CudaMemoryResource(0))
    buf = Buffer.from_bytes(b"abc", mr)
    s = Stream.create()
    s.close()
    for call in (lambda: buf.tobytes(s), lambda: buf.copy(s), lambda: Buffer.from_bytes(b"x", mr, s)):
        with pytest.raises(ValueError, match=r"stream .* is closed"):
            call()
    assert buf.tobytes() == b"abc"
    buf.close()
    mr.close()
