"""``mrkit.cupy``: use mrkit resources as CuPy's allocators (see :mod:`mrkit.integrations.cupy`)."""
from .integrations.cupy import allocator, install, install_pinned, pinned_allocator, resource_of, using_allocator

__all__ = ["allocator", "pinned_allocator", "install", "install_pinned", "using_allocator", "resource_of"]
