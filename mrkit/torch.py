"""``mrkit.torch``: mrkit resources behind PyTorch's CUDA allocator (see :mod:`mrkit.integrations.torch`)."""
from .integrations.torch import AllocatorCallbacks, TorchAllocator, allocator, install, pool

__all__ = ["AllocatorCallbacks", "TorchAllocator", "allocator", "pool", "install"]
