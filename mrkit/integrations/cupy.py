"""CuPy integration: mrkit resources as CuPy's device and pinned allocators.

CuPy is imported when first needed. Allocation happens on CuPy's current stream; CuPy gives no stream
when it frees, so each block is freed on the stream it was allocated on, when CuPy drops its last
reference: the block is owned by a :class:`~mrkit.Buffer` that rides on CuPy's memory object (no free
callbacks). The device id is passed explicitly so CuPy does not query the pointer on every allocation.
"""
from __future__ import annotations

from contextlib import contextmanager

from .._resource import Buffer, MemoryResource, get_current_resource
from .._stream import DEFAULT_STREAM, as_stream

__all__ = ["allocator", "pinned_allocator", "install", "install_pinned", "using_allocator"]


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("mrkit.cupy needs CuPy: pip install 'mrkit[cupy]' (cupy-cuda13x) or "
                          "'mrkit[cupy12]' (cupy-cuda12x)") from exc
    return cupy


def allocator(mr: MemoryResource | None = None):
    """A function for ``cupy.cuda.set_allocator`` allocating from ``mr`` (default: the current
    resource of device 0) on CuPy's current stream."""
    cupy = _cupy()
    mr = mr or get_current_resource()
    if not mr.device_accessible:
        raise ValueError(f"{mr!r} is not device-accessible; use pinned_allocator() for host memory")
    device = mr.device_id or 0
    get_stream = cupy.cuda.get_current_stream
    Unowned = cupy.cuda.UnownedMemory
    MemoryPointer = cupy.cuda.MemoryPointer
    alloc = mr.allocate

    def malloc(nbytes: int):
        cs = get_stream()
        # as_stream caches per stream object, so a reused handle never aliases an old stream
        s = DEFAULT_STREAM if cs.ptr == 0 else as_stream(cs)
        ptr = alloc(nbytes, s)
        return MemoryPointer(Unowned(ptr, nbytes, Buffer(ptr, nbytes, mr, s), device), 0)

    malloc.resource = mr
    return malloc


class _PinnedBlock:
    """What CuPy's ``PinnedMemoryPointer`` needs (``ptr``, ``size``); frees when dropped."""

    __slots__ = ("ptr", "size", "_buf")

    def __init__(self, buf: Buffer) -> None:
        self.ptr, self.size, self._buf = buf.ptr, buf.size, buf


def pinned_allocator(mr: MemoryResource | None = None):
    """A function for ``cupy.cuda.set_pinned_memory_allocator`` allocating host memory from ``mr``
    (default: a pool of pinned memory)."""
    cupy = _cupy()
    if mr is None:
        from ..resources import PinnedMemoryResource
        from ..suballoc import PoolResource
        mr = PoolResource(PinnedMemoryResource())
    if not mr.host_accessible:
        raise ValueError(f"{mr!r} is not host-accessible; pinned allocators need host memory")
    Pointer = cupy.cuda.PinnedMemoryPointer

    def malloc(nbytes: int):
        buf = Buffer(mr.allocate(nbytes, DEFAULT_STREAM), nbytes, mr, DEFAULT_STREAM)
        return Pointer(_PinnedBlock(buf), 0)

    malloc.resource = mr
    return malloc


def install(mr: MemoryResource | None = None):
    """Make ``mr`` CuPy's global device allocator; returns the allocator installed."""
    fn = allocator(mr)
    _cupy().cuda.set_allocator(fn)
    return fn


def install_pinned(mr: MemoryResource | None = None):
    """Make ``mr`` CuPy's global pinned-memory allocator; returns the allocator installed."""
    fn = pinned_allocator(mr)
    _cupy().cuda.set_pinned_memory_allocator(fn)
    return fn


@contextmanager
def using_allocator(mr: MemoryResource | None = None):
    """``with mrkit.cupy.using_allocator(mr):`` CuPy allocates from ``mr`` inside the block (on this
    thread; CuPy's ``using_allocator`` semantics)."""
    cupy = _cupy()
    with cupy.cuda.using_allocator(allocator(mr)):
        yield
