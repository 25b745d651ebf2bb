"""``mrkit.numba``: Numba's external memory manager plugin (``NUMBA_CUDA_MEMORY_MANAGER=mrkit.numba``)."""


def __getattr__(name):
    if name in ("MrkitNumbaManager", "_numba_memory_manager", "install"):
        from .integrations import numba as _impl
        return getattr(_impl, name)
    raise AttributeError(name)


__all__ = ["MrkitNumbaManager", "install"]
