"""Factories of every resource and adaptor mrkit ships, for the conformance suite and the machine."""
from __future__ import annotations

import io

from ..adaptors import LimitingAdaptor, LoggingAdaptor, RetryAdaptor, StatisticsAdaptor, TrackingAdaptor
from ..resources import (
    BinningResource, PoolResource,
    CudaMemoryResource, DeviceMemoryResource, DeviceMemoryResourceOptions, HostMemoryResource,
    ManagedMemoryResource, PinnedMemoryResource, VirtualMemoryResource, VirtualMemoryResourceOptions,
)

__all__ = ["BUILTIN_FACTORIES"]


def _owned_pool(drv):
    return DeviceMemoryResource(0, DeviceMemoryResourceOptions(initial_size=1 << 20, release_threshold=0), driver=drv)


#: name -> factory(driver) for every resource and adaptor, alone and in compositions.
BUILTIN_FACTORIES = {
    "cuda": lambda drv: CudaMemoryResource(driver=drv),
    "host": lambda drv: HostMemoryResource(),
    "pinned": lambda drv: PinnedMemoryResource(driver=drv),
    "managed": lambda drv: ManagedMemoryResource(driver=drv),
    "device(current pool)": lambda drv: DeviceMemoryResource(driver=drv),
    "device(owned pool)": _owned_pool,
    "pool(cuda)": lambda drv: PoolResource(CudaMemoryResource(driver=drv)),
    "pool(device)": lambda drv: PoolResource(DeviceMemoryResource(driver=drv), min_chunk=1 << 20),
    "pool(pinned)": lambda drv: PoolResource(PinnedMemoryResource(driver=drv)),
    "pool(managed)": lambda drv: PoolResource(ManagedMemoryResource(driver=drv)),
    "pool(host)": lambda drv: PoolResource(HostMemoryResource()),
    "pool(cuda, bounded)": lambda drv: PoolResource(CudaMemoryResource(driver=drv), 1 << 20, 64 << 20),
    "statistics(pool(device))": lambda drv: StatisticsAdaptor(PoolResource(DeviceMemoryResource(driver=drv))),
    "limiting(cuda)": lambda drv: LimitingAdaptor(CudaMemoryResource(driver=drv), "64 MiB"),
    "limiting(pool(cuda), 4 MiB)": lambda drv: LimitingAdaptor(PoolResource(CudaMemoryResource(driver=drv)), "4 MiB"),
    "statistics(limiting(pool(device)))": lambda drv: StatisticsAdaptor(
        LimitingAdaptor(PoolResource(DeviceMemoryResource(driver=drv)), "128 MiB")),
    "tracking(logging(pool(cuda)))": lambda drv: TrackingAdaptor(
        LoggingAdaptor(PoolResource(CudaMemoryResource(driver=drv)), io.StringIO()), capture_stacks=True),
    "retry(limiting(pool(cuda)))": lambda drv: RetryAdaptor(
        LimitingAdaptor(PoolResource(CudaMemoryResource(driver=drv)), "32 MiB"), lambda n, attempt: attempt < 2),
    "binning(cuda)": lambda drv: BinningResource(CudaMemoryResource(driver=drv), "64 KiB", chunk_size="1 MiB"),
    "statistics(binning(device))": lambda drv: StatisticsAdaptor(BinningResource(DeviceMemoryResource(driver=drv))),
    "statistics(host)": lambda drv: StatisticsAdaptor(HostMemoryResource()),
    "vmm": lambda drv: VirtualMemoryResource(0, driver=drv),
    "vmm(auto-release)": lambda drv: VirtualMemoryResource(
        0, VirtualMemoryResourceOptions(release_threshold="4 MiB", reserve_size="1 GiB"), driver=drv),
    "vmm(page runs, relative release)": lambda drv: VirtualMemoryResource(
        0, VirtualMemoryResourceOptions(max_mapping="2 MiB", release_fraction=0.1), driver=drv),
    "statistics(vmm)": lambda drv: StatisticsAdaptor(VirtualMemoryResource(0, driver=drv)),
    "vmm(256 MiB mappings)": lambda drv: VirtualMemoryResource(
        0, VirtualMemoryResourceOptions(max_mapping="256 MiB"), driver=drv),
    "vmm(moving pages, footprint_limit=1.0)": lambda drv: VirtualMemoryResource(
        0, VirtualMemoryResourceOptions(max_mapping="16 MiB", footprint_limit=1.0), driver=drv),
}
