"""``mrkit.torch``: mrkit resources behind PyTorch's CUDA allocator (see :mod:`mrkit.integrations.torch`)."""
from .integrations.torch import TorchAllocator, allocator, install, pool

__all__ = ["TorchAllocator", "allocator", "pool", "install"]
