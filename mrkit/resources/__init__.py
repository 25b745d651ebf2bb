"""Upstream resources: where memory comes from."""
from ._basic import CudaMemoryResource, HostMemoryResource, ManagedMemoryResource, PinnedMemoryResource
from ._device import DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryPool
from ._binning import BinningResource
from ._pool import PoolResource
from ._vmm import VirtualMemoryResource, VirtualMemoryResourceOptions

__all__ = [
    "CudaMemoryResource", "HostMemoryResource", "ManagedMemoryResource", "PinnedMemoryResource",
    "DeviceMemoryResource", "DeviceMemoryResourceOptions", "MemoryPool",
    "VirtualMemoryResource", "VirtualMemoryResourceOptions", "PoolResource", "BinningResource",
]
