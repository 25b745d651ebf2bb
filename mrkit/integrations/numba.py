"""Numba external memory manager (EMM) plugin backed by mrkit's current resource.

Select it with ``NUMBA_CUDA_MEMORY_MANAGER=mrkit.numba`` or
``numba.cuda.set_memory_manager(mrkit.numba.MrkitNumbaManager)`` before Numba creates its context.
"""
from __future__ import annotations

from .._current import get_current_resource
from .._resource import Buffer
from .._stream import DEFAULT_STREAM

__all__ = ["MrkitNumbaManager", "make_manager_class", "install"]


def make_manager_class():
    """Build the EMM plugin class (Numba is imported here, not at mrkit import)."""
    from numba import cuda
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

    # numba-cuda wraps device pointers in the CUdeviceptr of the binding it drives the GPU with
    try:
        from numba.cuda.cudadrv.driver import binding as _binding
        make_ptr = _binding.CUdeviceptr
    except (ImportError, AttributeError):  # pragma: no cover - older numba
        from cuda.bindings.driver import CUdeviceptr as make_ptr

    class MrkitNumbaManager(HostOnlyCUDAMemoryManager):
        """Device allocations come from ``mrkit.get_current_resource(device)`` on the default stream
        (Numba's EMM interface has no stream); each is owned by a :class:`~mrkit.Buffer` released by
        Numba's finalizer."""

        def initialize(self):
            """Nothing to set up (each allocation asks for the current resource); Numba's interface
            declares this method abstract, so the plugin must define it."""

        def memalloc(self, size):
            mr = get_current_resource(self.context.device.id)
            buf = Buffer(mr.allocate(size, DEFAULT_STREAM), size, mr, DEFAULT_STREAM)
            return MemoryPointer(self.context, make_ptr(buf.ptr), size, finalizer=buf.close)

        def get_memory_info(self):
            from ..driver import get_driver
            free, total = get_driver().mem_get_info(self.context.device.id)
            return MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory):  # pragma: no cover - IPC goes through MemoryPool
            raise NotImplementedError("use mrkit.MemoryPool.export_pointer for IPC of mrkit memory")

        @property
        def interface_version(self):
            return 1

    del cuda
    return MrkitNumbaManager


def install():
    """Make mrkit Numba's memory manager (``numba.cuda.set_memory_manager``); Numba must not have
    created its CUDA context yet (Numba raises otherwise)."""
    from numba import cuda
    cls = __getattr__("MrkitNumbaManager")
    cuda.set_memory_manager(cls)
    return cls


def __getattr__(name):
    if name in ("MrkitNumbaManager", "_numba_memory_manager"):
        cls = make_manager_class()
        globals()["MrkitNumbaManager"] = globals()["_numba_memory_manager"] = cls
        return cls
    raise AttributeError(name)
