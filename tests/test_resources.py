"""Driver-backed resources on the simulator: device pools, managed and pinned memory."""
from __future__ import annotations

import pytest

from mrkit import (
    DEFAULT_STREAM, DeviceMemoryResource, DeviceMemoryResourceOptions, ManagedMemoryResource,
    MemoryPool, OutOfMemoryError, PinnedMemoryResource, PoolResource, Stream,
)
from mrkit.driver import SimDeviceSpec, SimDriver


def test_device_resource_wraps_the_current_pool_without_changing_it(sim):
    mr = DeviceMemoryResource()
    assert not mr.pool.owned and mr.pool == MemoryPool.current(0)
    assert mr == DeviceMemoryResource() and hash(mr) == hash(DeviceMemoryResource())
    with pytest.raises(ValueError, match="process_wide=True"):
        mr.pool.set_attribute("release_threshold", 1 << 30)
    with pytest.raises(ValueError, match="shared by the whole process"):
        mr.pool.enable_access_from(0)
    mr.pool.set_attribute("release_threshold", 1 << 20, process_wide=True)
    assert mr.pool.release_threshold == 1 << 20


def test_owned_pool_from_options(sim):
    opts = DeviceMemoryResourceOptions(initial_size="4 MiB", max_size="16 MiB", release_threshold="8 MiB",
                                       reuse_allow_opportunistic=False)
    mr = DeviceMemoryResource(0, opts)
    pool = mr.pool
    assert pool.owned and mr != DeviceMemoryResource()
    attrs = pool.attributes
    assert attrs["reserved_mem_current"] == 4 << 20  # pre-filled and kept
    assert attrs["release_threshold"] == 8 << 20 and attrs["reuse_allow_opportunistic"] == 0
    assert attrs["used_mem_high"] == 4 << 20  # the pre-fill
    pool.reset_high_watermarks()
    assert pool.used_mem_high == 0 and pool.reserved_mem_high == 4 << 20
    s = Stream.create()
    p = mr.allocate(1 << 20, s)
    assert pool.used_mem_current == 1 << 20 and pool.used_mem_high == 1 << 20
    mr.deallocate(p, 1 << 20, s)
    with pytest.raises(OutOfMemoryError, match="could not allocate 33554432 bytes"):
        mr.allocate(32 << 20, s)
    pool.reset_high_watermarks()
    assert pool.used_mem_high == 0
    mr.trim()
    assert pool.reserved_mem_current == 0
    mr.close()
    with pytest.raises(ValueError, match="is closed"):  # the destroyed pool's handle never reaches the driver
        mr.allocate(10, s)


def test_pool_creation_undoes_itself_on_failure():
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 20)])
    with pytest.raises(OutOfMemoryError):
        DeviceMemoryResource(0, DeviceMemoryResourceOptions(initial_size="2 MiB"), driver=drv)
    live = drv.pools()
    assert live == []  # the half-built pool was destroyed


@pytest.mark.parametrize("kwargs,exc", [({"ipc_handle_type": "fabric"}, ValueError),
                                        ({"initial_size": "2 MiB", "max_size": "1 MiB"}, ValueError),
                                        ({"max_size": "lots"}, ValueError)])
def test_options_validate(kwargs, exc):
    with pytest.raises(exc):
        DeviceMemoryResourceOptions(**kwargs)


def test_peer_access_and_ipc(sim):
    drv = SimDriver(2)
    mr = DeviceMemoryResource(0, DeviceMemoryResourceOptions(ipc_handle_type="posix_fd"), driver=drv)
    assert mr.pool.is_accessible_from(0) and not mr.pool.is_accessible_from(1)
    mr.pool.enable_access_from(1)
    assert mr.pool.access_from(1) == "readwrite"
    s = Stream.create(0, driver=drv)
    p = mr.allocate(256, s)
    imported = MemoryPool.from_shareable_handle(mr.pool.export_handle(), driver=drv)
    assert imported.import_pointer(mr.pool.export_pointer(p)) == p
    mr.deallocate(p, 256, s)


def test_device_resource_rejects_devices_without_pools():
    drv = SimDriver([SimDeviceSpec(memory_pools=False)])
    with pytest.raises(ValueError, match="does not support memory pools"):
        DeviceMemoryResource(driver=drv)


def test_managed_resource_is_host_and_device_accessible(sim):
    mr = ManagedMemoryResource()
    assert mr.host_accessible and mr.device_accessible
    s = Stream.create()
    p = mr.allocate(4096, s)
    sim.write(p, b"abc")
    assert sim.read(p, 3) == b"abc"
    mr.advise(p, 4096, "set_preferred_location", 0)
    mr.advise(p, 4096, "set_accessed_by", "host")
    mr.prefetch(p, 4096, 0, s)
    assert sim.managed_advice(p) == {"preferred_location": 0, "accessed_by": "host"}
    s.synchronize()
    mr.deallocate(p, 4096, s)
    with pytest.raises(ValueError):
        ManagedMemoryResource(attach="everywhere")


def test_pinned_resource_flags_and_pooling(sim):
    mr = PinnedMemoryResource(writecombined=True)
    assert mr != PinnedMemoryResource() and mr.host_accessible and mr.device_accessible
    p = mr.allocate(100, DEFAULT_STREAM)
    sim.write(p, b"pinned")
    assert sim.read(p, 6) == b"pinned" and sim.pointer_info(p)["memory_type"] == "host"
    mr.deallocate(p, 100, DEFAULT_STREAM)
    pooled = PoolResource(PinnedMemoryResource())
    q = pooled.allocate(64, DEFAULT_STREAM)
    pooled.deallocate(q, 64, DEFAULT_STREAM)
    assert pooled.allocate(64, DEFAULT_STREAM) == q  # no new pinning for repeated requests
