"""The simulated backend: documented rules, misuse errors, and the stream-order checker."""
from __future__ import annotations

import pytest

import mrkit
from mrkit import CUDAError, OutOfMemoryError, StreamOrderViolation
from mrkit.driver import SimDeviceSpec, SimDriver


def _code(exc_info):
    return exc_info.value.name


# -- devices ------------------------------------------------------------------------------
def test_devices_are_configurable():
    drv = SimDriver([SimDeviceSpec(name="a", total_memory=1 << 20, memory_pools=False),
                     SimDeviceSpec(name="b", granularity=1 << 16, vmm=False)])
    assert drv.device_count() == 2
    assert drv.device_name(1) == "b"
    assert drv.device_total_mem(0) == 1 << 20
    assert drv.device_capability(0, "memory_pools_supported") == 0
    assert drv.device_capability(1, "virtual_memory_management_supported") == 0
    with pytest.raises(CUDAError) as e:
        drv.device_name(2)
    assert _code(e) == "CUDA_ERROR_INVALID_DEVICE"
    with pytest.raises(CUDAError) as e:
        drv.device_get_default_mem_pool(0)
    assert _code(e) == "CUDA_ERROR_NOT_SUPPORTED"
    with pytest.raises(CUDAError) as e:
        drv.mem_create(1, 1 << 16)
    assert _code(e) == "CUDA_ERROR_NOT_SUPPORTED"


def test_sparse_backing_allows_huge_devices():
    drv = SimDriver([SimDeviceSpec(total_memory=80 << 30)])
    p = drv.mem_alloc(0, 40 << 30)
    assert drv.mem_get_info(0) == (40 << 30, 80 << 30)
    drv.copy_from_host(p + (30 << 30), b"xyz", 0)
    assert drv.copy_to_host(p + (30 << 30), 3, 0) == b"xyz"
    drv.mem_free(p)
    assert drv.mem_get_info(0)[0] == 80 << 30


# -- scheduling -----------------------------------------------------------------------------
def test_work_runs_only_when_the_scheduler_advances():
    drv = SimDriver()
    s = drv.stream_create(0)
    p = drv.mem_alloc(0, 64)
    drv.memset_async(p, 9, 64, s)
    assert drv.pending_ops() == 1
    assert drv.peek(p, 4) == b"\0" * 4
    assert not drv.stream_query(s)
    assert drv.step(s)
    assert drv.peek(p, 4) == b"\x09" * 4
    assert drv.stream_query(s)


def test_fifo_order_within_a_stream():
    drv = SimDriver(policy="random", seed=3)
    s = drv.stream_create(0)
    p = drv.mem_alloc(0, 8)
    for v in range(1, 30):
        drv.memset_async(p, v, 8, s)
    drv.run_random(seed=11)
    assert drv.peek(p, 8) == b"\x1d" * 8


def test_event_wait_orders_streams_and_blocks_execution():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    p = drv.mem_alloc(0, 16)
    drv.memset_async(p, 1, 16, a)
    e = drv.event_create(0)
    drv.event_record(e, a)
    assert not drv.event_query(e)
    drv.stream_wait_event(b, e)
    drv.memset_async(p, 2, 16, b)  # ordered after a's memset: no violation
    assert not drv.step(b)  # b is blocked on the event
    drv.stream_synchronize(b)  # runs a's work first, then b's
    assert drv.event_query(e)
    assert drv.peek(p, 16) == b"\x02" * 16


def test_wait_uses_the_record_current_at_call_time():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    p = drv.mem_alloc(0, 16)
    e = drv.event_create(0)
    drv.event_record(e, a)
    drv.stream_wait_event(b, e)
    drv.memset_async(p, 1, 16, a)  # after the recorded point: not ordered before b
    with pytest.raises(StreamOrderViolation) as v:
        drv.memset_async(p, 2, 16, b)
    assert v.value.kind == "race"


def test_never_recorded_event_is_complete():
    drv = SimDriver()
    e = drv.event_create(0)
    assert drv.event_query(e)
    drv.event_synchronize(e)
    drv.stream_wait_event(drv.stream_create(0), e)


def test_legacy_default_stream_synchronises_with_blocking_streams():
    drv = SimDriver()
    blocking = drv.stream_create(0, nonblocking=False)
    nonblocking = drv.stream_create(0, nonblocking=True)
    p = drv.mem_alloc(0, 32)
    drv.memset_async(p, 1, 16, blocking)
    drv.memset_async(p, 2, 16, 0)  # legacy default stream waits for the blocking stream
    drv.memset_async(p, 3, 16, blocking)  # and the blocking stream waits for the default stream
    drv.memset_async(p + 16, 4, 16, nonblocking)
    with pytest.raises(StreamOrderViolation):
        drv.memset_async(p + 16, 5, 16, 0)  # no implicit sync with a non-blocking stream
    drv.ctx_synchronize(0)
    assert drv.peek(p, 16) == b"\x03" * 16


def test_destroyed_stream_work_still_completes_and_handle_is_reused():
    drv = SimDriver()
    s = drv.stream_create(0)
    uid = drv.stream_get_id(s)
    p = drv.mem_alloc(0, 8)
    drv.memset_async(p, 7, 8, s)
    drv.stream_destroy(s)
    with pytest.raises(CUDAError) as e:
        drv.memset_async(p, 1, 8, s)
    assert _code(e) == "CUDA_ERROR_INVALID_HANDLE"
    t = drv.stream_create(0)
    assert t == s and drv.stream_get_id(t) != uid  # same handle, new identity
    with pytest.raises(StreamOrderViolation):
        drv.memset_async(p, 2, 8, t)  # the new stream is not ordered after the old one's work
    drv.ctx_synchronize(0)
    assert drv.peek(p, 8) == b"\x07" * 8
    assert drv.pending_ops() == 0


def test_default_stream_cannot_be_destroyed_and_bad_handles_fail():
    drv = SimDriver()
    for h in (0, 2):
        with pytest.raises(CUDAError):
            drv.stream_destroy(h)
    with pytest.raises(CUDAError) as e:
        drv.stream_synchronize(0xDEAD0)
    assert _code(e) == "CUDA_ERROR_INVALID_HANDLE"
    with pytest.raises(CUDAError) as e:
        drv.event_record(0xDEAD0, 0)
    assert _code(e) == "CUDA_ERROR_INVALID_HANDLE"


def test_host_observation_orders_later_work():
    drv = SimDriver()
    a, b, c = drv.stream_create(0), drv.stream_create(0), drv.stream_create(0)
    p = drv.mem_alloc(0, 8)
    drv.memset_async(p, 1, 8, a)
    drv.stream_synchronize(a)
    drv.memset_async(p, 2, 8, b)  # the host saw a finish before enqueueing: ordered
    while drv.step(b):
        pass  # b's work ran, but the host never observed it
    with pytest.raises(StreamOrderViolation):
        drv.touch(p, 8, c)
    assert drv.stream_query(b)  # observing completion orders later work
    drv.touch(p, 8, c)


# -- the checker ------------------------------------------------------------------------------
def test_reads_do_not_conflict_but_writes_do():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    p = drv.mem_alloc(0, 64)
    drv.touch(p, 64, a, write=False)
    drv.touch(p, 64, b, write=False)
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(p, 8, b, write=True)
    assert "read" in str(v.value)


def test_disjoint_ranges_do_not_conflict():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    p = drv.mem_alloc(0, 512)
    drv.touch(p, 256, a)
    drv.touch(p + 256, 256, b)


def test_violation_leaves_no_trace_and_names_the_ops():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    p, q = drv.mem_alloc(0, 64), drv.mem_alloc(0, 64)
    drv.touch(q, 64, a)
    before = drv.pending_ops()
    with pytest.raises(StreamOrderViolation) as v:
        drv.memcpy_async(p, q, 64, b)  # the read of q conflicts; nothing may be recorded for p
    assert drv.pending_ops() == before
    assert "kernel writing" in str(v.value) and "cuMemcpyAsync" in str(v.value)
    drv.touch(p, 64, a)  # p was not recorded as written by b


def test_use_after_free_and_unallocated_and_out_of_bounds():
    drv = SimDriver()
    s = drv.stream_create(0)
    p = drv.mem_alloc(0, 256)
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(p + 200, 100, s)
    assert v.value.kind == "out-of-bounds"
    drv.mem_free(p)
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(p, 8, s)
    assert v.value.kind == "use-after-free"
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(0x1234, 8, s)
    assert v.value.kind == "unallocated"


def test_stream_ordered_use_before_allocation_and_after_free():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    pool = drv.device_get_default_mem_pool(0)
    p = drv.mem_alloc_from_pool_async(256, pool, a)
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(p, 256, b)
    assert v.value.kind == "use-before-allocation"
    drv.touch(p, 256, a)
    drv.mem_free_async(p, a)
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(p, 256, a)  # ordered after the free: still a use after free
    assert v.value.kind == "use-after-free"


def test_free_racing_a_use_on_another_stream():
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    pool = drv.device_get_default_mem_pool(0)
    p = drv.mem_alloc_from_pool_async(256, pool, a)
    drv.touch(p, 256, a)
    e = drv.event_create(0)
    drv.event_record(e, a)
    drv.stream_wait_event(b, e)
    drv.touch(p, 256, b)
    with pytest.raises(StreamOrderViolation):
        drv.mem_free_async(p, a)  # a is not ordered after b's use


# -- planted bugs: found within a bounded search; correct code passes every interleaving ------
def _reuse_without_wait(drv, wait: bool):
    """A naive sub-allocator: block freed on stream A handed to stream B."""
    a, b = drv.stream_create(0), drv.stream_create(0)
    p = drv.mem_alloc(0, 4096)
    drv.memset_async(p, 1, 4096, a)  # A's kernel uses the block, then A "frees" it
    if wait:
        e = drv.event_create(0)
        drv.event_record(e, a)
        drv.stream_wait_event(b, e)
    drv.memset_async(p, 2, 4096, b)  # B reuses it
    drv.run_all()
    return drv.peek(p, 4096)


def test_planted_cross_stream_reuse_is_caught_in_every_interleaving():
    caught = 0
    for seed in range(20):
        try:
            _reuse_without_wait(SimDriver(policy="random", seed=seed), wait=False)
        except StreamOrderViolation:
            caught += 1
    assert caught == 20


def test_correct_code_passes_every_interleaving_and_data_is_right():
    for seed in range(50):
        assert _reuse_without_wait(SimDriver(policy="random", seed=seed), wait=True) == b"\x02" * 4096


def test_unmap_while_work_is_pending_is_caught_when_the_work_runs():
    drv = SimDriver()
    s = drv.stream_create(0)
    g = drv.mem_get_allocation_granularity(0)
    va = drv.mem_address_reserve(g)
    h = drv.mem_create(0, g)
    drv.mem_map(va, g, 0, h)
    drv.mem_set_access(va, g, 0)
    drv.memset_async(va, 1, g, s)
    drv.mem_unmap(va, g)  # not stream ordered: the memset has not run yet
    with pytest.raises(StreamOrderViolation) as v:
        drv.stream_synchronize(s)
    assert v.value.kind == "unmapped" and "when the op ran" in str(v.value)


# -- plain allocation errors ----------------------------------------------------------------
def test_mem_alloc_errors():
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 20)])
    with pytest.raises(OutOfMemoryError) as e:
        drv.mem_alloc(0, 2 << 20)
    assert "2097152" in str(e.value)
    with pytest.raises(CUDAError) as e:
        drv.mem_alloc(0, 0)
    assert _code(e) == "CUDA_ERROR_INVALID_VALUE"
    p = drv.mem_alloc(0, 100)
    drv.mem_free(p)
    with pytest.raises(CUDAError) as e:
        drv.mem_free(p)
    assert _code(e) == "CUDA_ERROR_INVALID_VALUE"
    with pytest.raises(CUDAError):
        drv.mem_free_host(drv.mem_alloc(0, 8))


def test_freed_addresses_are_reused():
    drv = SimDriver()
    p = drv.mem_alloc(0, 4096)
    drv.mem_free(p)
    assert drv.mem_alloc(0, 4096) == p


def test_host_memory_is_readable_and_checked():
    drv = SimDriver()
    s = drv.stream_create(0)
    h = drv.mem_host_alloc(64)
    drv.write(h, b"hello")
    assert drv.read(h, 5) == b"hello"
    drv.memset_async(h, 0x41, 5, s)
    with pytest.raises(StreamOrderViolation):
        drv.read(h, 5)  # the device write is not observed yet
    drv.stream_synchronize(s)
    assert drv.read(h, 5) == b"AAAAA"
    d = drv.mem_alloc(0, 8)
    with pytest.raises(ValueError, match="device memory"):
        drv.read(d, 8)
    assert drv.pointer_info(h)["memory_type"] == "host"


def test_managed_memory_advice_prefetch_and_concurrent_access():
    drv = SimDriver([SimDeviceSpec(concurrent_managed_access=False)])
    s = drv.stream_create(0)
    m = drv.mem_alloc_managed(0, 4096)
    drv.mem_advise(m, 4096, "set_preferred_location", 0)
    drv.mem_advise(m, 4096, "set_read_mostly", "host")
    assert drv.managed_advice(m) == {"preferred_location": 0, "read_mostly": "host"}
    drv.mem_advise(m, 4096, "unset_read_mostly", "host")
    assert drv.managed_advice(m) == {"preferred_location": 0}
    drv.mem_prefetch_async(m, 4096, 0, s)
    with pytest.raises(StreamOrderViolation):
        drv.write(m, b"x")  # work pending on a device without concurrent managed access
    drv.stream_synchronize(s)
    drv.write(m, b"x")
    with pytest.raises(CUDAError) as e:
        drv.mem_advise(drv.mem_alloc(0, 64), 64, "set_read_mostly", 0)
    assert _code(e) == "CUDA_ERROR_INVALID_VALUE"
    with pytest.raises(ValueError, match="unsupported advice"):
        drv.mem_advise(m, 64, "make_it_fast", 0)


# -- pools ------------------------------------------------------------------------------------
def test_pool_same_stream_reuse_and_attributes():
    drv = SimDriver()
    s = drv.stream_create(0)
    pool = drv.mem_pool_create(0)
    drv.mem_pool_set_attribute(pool, "release_threshold", 1 << 30)
    p = drv.mem_alloc_from_pool_async(1000, pool, s)
    assert drv.mem_pool_get_attribute(pool, "used_mem_current") == 1024
    drv.mem_free_async(p, s)
    assert drv.mem_alloc_from_pool_async(1000, pool, s) == p  # reusable on s at once
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_current") == 1024
    with pytest.raises(CUDAError):
        drv.mem_pool_set_attribute(pool, "reserved_mem_high", 5)
    with pytest.raises(CUDAError):
        drv.mem_pool_set_attribute(pool, "used_mem_current", 0)


@pytest.mark.parametrize("policy", ["none", "event", "opportunistic", "internal"])
def test_pool_cross_stream_reuse_rules(policy):
    drv = SimDriver()
    a, b = drv.stream_create(0), drv.stream_create(0)
    pool = drv.mem_pool_create(0)
    drv.mem_pool_set_attribute(pool, "release_threshold", 1 << 30)
    for name in ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
                 "reuse_allow_internal_dependencies"):
        drv.mem_pool_set_attribute(pool, name, int(policy in name))
    p = drv.mem_alloc_from_pool_async(512, pool, a)
    drv.touch(p, 512, a)
    drv.mem_free_async(p, a)
    if policy == "event":
        e = drv.event_create(0)
        drv.event_record(e, a)
        drv.stream_wait_event(b, e)
    if policy == "opportunistic":
        drv.run_all()  # the free completed (not observed by the host)
    q = drv.mem_alloc_from_pool_async(512, pool, b)
    assert (q == p) == (policy != "none")
    drv.touch(q, 512, b)  # in every case the reuse is correctly ordered: no violation
    drv.ctx_synchronize(0)


def test_pool_release_threshold_and_trim():
    drv = SimDriver()
    s = drv.stream_create(0)
    pool = drv.mem_pool_create(0)
    drv.mem_pool_set_attribute(pool, "release_threshold", 4096)
    ptrs = [drv.mem_alloc_from_pool_async(4096, pool, s) for _ in range(4)]
    for p in ptrs:
        drv.mem_free_async(p, s)
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_current") == 4 * 4096
    drv.mem_pool_trim_to(pool, 0)  # frees not yet completed count as outstanding
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_current") == 4 * 4096
    drv.stream_synchronize(s)  # a synchronise releases down to the threshold
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_current") == 4096
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_high") == 4 * 4096
    drv.mem_pool_set_attribute(pool, "reserved_mem_high", 0)
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_high") == 4096
    drv.mem_pool_trim_to(pool, 0)
    assert drv.mem_pool_get_attribute(pool, "reserved_mem_current") == 0


def test_pool_errors():
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 20), SimDeviceSpec()])
    s = drv.stream_create(0)
    pool = drv.mem_pool_create(0, max_size=8192)
    with pytest.raises(OutOfMemoryError):
        drv.mem_alloc_from_pool_async(16384, pool, s)
    with pytest.raises(CUDAError) as e:
        drv.mem_free_async(drv.mem_alloc(0, 64), s)
    assert _code(e) == "CUDA_ERROR_INVALID_VALUE"
    p = drv.mem_alloc_from_pool_async(64, pool, s)
    drv.mem_free_async(p, s)
    with pytest.raises(CUDAError) as e:
        drv.mem_free_async(p, s)  # double free
    assert _code(e) == "CUDA_ERROR_INVALID_VALUE"
    with pytest.raises(CUDAError):
        drv.mem_pool_destroy(drv.device_get_default_mem_pool(0))
    with pytest.raises(CUDAError):
        drv.mem_pool_set_access(pool, 0, "read")  # the owner keeps read-write
    drv.mem_pool_destroy(pool)
    with pytest.raises(CUDAError):
        drv.mem_alloc_from_pool_async(64, pool, s)


def test_pool_peer_access_is_checked():
    drv = SimDriver(2)
    s0, s1 = drv.stream_create(0), drv.stream_create(1)
    pool = drv.mem_pool_create(0)
    p = drv.mem_alloc_from_pool_async(256, pool, s0)
    drv.stream_synchronize(s0)
    assert drv.mem_pool_get_access(pool, 1) == "none"
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(p, 256, s1)
    assert v.value.kind == "not-accessible"
    drv.mem_pool_set_access(pool, 1, "read")
    drv.touch(p, 256, s1, write=False)
    with pytest.raises(StreamOrderViolation):
        drv.touch(p, 256, s1, write=True)
    drv.mem_pool_set_access(pool, 1, "readwrite")
    drv.touch(p, 256, s1, write=True)


def test_pool_ipc_export_import():
    drv = SimDriver()
    s = drv.stream_create(0)
    plain = drv.mem_pool_create(0)
    with pytest.raises(CUDAError):
        drv.mem_pool_export_to_shareable_handle(plain)
    pool = drv.mem_pool_create(0, ipc_handle_type="posix_fd")
    p = drv.mem_alloc_from_pool_async(256, pool, s)
    fd = drv.mem_pool_export_to_shareable_handle(pool)
    imported = drv.mem_pool_import_from_shareable_handle(fd)
    data = drv.mem_pool_export_pointer(p)
    assert len(data) == 64
    assert drv.mem_pool_import_pointer(imported, data) == p
    with pytest.raises(CUDAError):
        drv.mem_alloc_from_pool_async(64, imported, s)
    with pytest.raises(CUDAError):
        drv.mem_pool_import_pointer(plain, data)


# -- VMM ----------------------------------------------------------------------------------------
def test_vmm_rules():
    drv = SimDriver()
    g = drv.mem_get_allocation_granularity(0)
    s = drv.stream_create(0)
    used0 = drv.mem_get_info(0)[0]
    with pytest.raises(CUDAError):
        drv.mem_create(0, g + 1)
    with pytest.raises(CUDAError):
        drv.mem_address_reserve(g + 1)
    va = drv.mem_address_reserve(4 * g)
    h = drv.mem_create(0, 2 * g)
    assert drv.mem_get_info(0)[0] == used0 - 2 * g
    with pytest.raises(CUDAError):
        drv.mem_map(va + 1, g, 0, h)
    with pytest.raises(CUDAError):
        drv.mem_map(va, 3 * g, 0, h)  # larger than the allocation
    drv.mem_map(va, 2 * g, 0, h)
    with pytest.raises(CUDAError):
        drv.mem_map(va + g, g, 0, drv.mem_create(0, g))  # already mapped
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(va, 64, s)  # no cuMemSetAccess yet
    assert v.value.kind == "not-accessible"
    with pytest.raises(CUDAError):
        drv.mem_set_access(va, 3 * g, 0)  # not fully mapped
    drv.mem_set_access(va, 2 * g, 0)
    drv.touch(va, 2 * g, s)
    with pytest.raises(StreamOrderViolation) as v:
        drv.touch(va + 2 * g, 64, s)
    assert v.value.kind == "unmapped"
    drv.stream_synchronize(s)
    with pytest.raises(CUDAError):
        drv.mem_unmap(va, g)  # sub-range
    with pytest.raises(CUDAError):
        drv.mem_address_free(va, 4 * g)  # still mapped
    drv.mem_release(h)  # deferred: still mapped
    assert drv.mem_get_info(0)[0] < used0 - g
    drv.mem_unmap(va, 2 * g)
    with pytest.raises(CUDAError):
        drv.mem_address_free(va, 2 * g)  # size must match the reservation
    drv.mem_address_free(va, 4 * g)
    assert drv.mem_get_info(0)[0] == used0 - g  # the other handle is still alive


def test_vmm_out_of_memory_is_an_oom_error():
    drv = SimDriver([SimDeviceSpec(total_memory=4 << 20)])
    with pytest.raises(OutOfMemoryError):
        drv.mem_create(0, 8 << 20)


def test_sim_is_injected_never_patched(sim):
    assert mrkit.get_driver() is sim
    with mrkit.use_backend(SimDriver(2)) as other:
        assert mrkit.get_driver() is other and other.device_count() == 2
    assert mrkit.get_driver() is sim
