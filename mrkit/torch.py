"""``mrkit.torch``: mrkit resources behind PyTorch's CUDA allocator (see :mod:`mrkit.integrations.torch`)."""
from .integrations.torch import (RELEASE_SPLIT_MB, AllocatorCallbacks, TorchAllocator, allocator,
                                 apply_queued_frees, install, pool)

__all__ = ["AllocatorCallbacks", "TorchAllocator", "allocator", "pool", "install", "apply_queued_frees",
           "RELEASE_SPLIT_MB"]
