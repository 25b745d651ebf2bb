"""Upstream resources: where memory comes from."""
from ._basic import CudaMemoryResource, HostMemoryResource, ManagedMemoryResource, PinnedMemoryResource
from ._device import DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryPool

__all__ = [
    "CudaMemoryResource", "HostMemoryResource", "ManagedMemoryResource", "PinnedMemoryResource",
    "DeviceMemoryResource", "DeviceMemoryResourceOptions", "MemoryPool",
]
