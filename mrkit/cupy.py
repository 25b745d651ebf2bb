"""``mrkit.cupy``: use mrkit resources as CuPy's allocators (see :mod:`mrkit.integrations.cupy`)."""
from .integrations.cupy import (ALLOCATION_UNIT, AllocatorHooks, allocator, install, install_pinned, late_frees,
                                pinned_allocator, resource_of, using_allocator)

__all__ = ["AllocatorHooks", "allocator", "pinned_allocator", "install", "install_pinned", "using_allocator",
           "resource_of", "ALLOCATION_UNIT", "late_frees"]
