"""CuPy integration: mrkit resources as CuPy's device and pinned allocators.

CuPy is imported when first needed. Allocation happens on CuPy's current stream; CuPy gives no stream
when it frees, so each block is freed on the stream it was allocated on, when CuPy drops its last
reference.

The device allocator is built on CuPy's ``PythonFunctionAllocator``: CuPy's own (compiled) memory
object calls mrkit's ``malloc(size, device_id)`` and, when CuPy drops it, ``free(ptr, device_id)``.
Over a pool those two are the pool's hot path itself (see ``PoolResource``); mrkit remembers each
block's stream, so the hot path creates no Python object besides CuPy's own two.
(``PythonFunctionAllocator`` exists in every CuPy the ``cupy`` and ``cupy12`` extras install.)
"""
from __future__ import annotations

import atexit
import weakref
from contextlib import contextmanager

from .._current import get_current_resource
from .._resource import Buffer, MemoryResource
from .._stream import DEFAULT_STREAM, as_stream
from .._engine import hot_paths

__all__ = ["allocator", "pinned_allocator", "install", "install_pinned", "using_allocator", "resource_of"]

_exiting = False


@atexit.register
def _at_exit() -> None:  # CuPy arrays that die during interpreter teardown are not freed one by one
    global _exiting
    _exiting = True


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("mrkit.cupy needs CuPy: pip install 'mrkit[cupy]' (cupy-cuda13x) or "
                          "'mrkit[cupy12]' (cupy-cuda12x)") from exc
    return cupy


def _stream_lookup():
    """``(cell, lookup)``: ``cell[0]`` is ``(weakref to the last CuPy stream seen, its mrkit Stream)``
    (one tuple, so threads always read a matching pair; weak, so no CuPy stream is kept alive, and an
    identity test against a live object cannot be fooled by address reuse); ``lookup(cs)`` converts
    and remembers."""
    cell = [(lambda: None, DEFAULT_STREAM)]

    def lookup(cs):
        s = as_stream(cs)  # CuPy's null stream (handle 0) is DEFAULT_STREAM, found without the driver
        try:
            cell[0] = (weakref.ref(cs), s)
        except TypeError:  # pragma: no cover - a stream object without weak references
            pass
        return s
    return cell, lookup


def allocator(mr: MemoryResource | None = None):
    """A function for ``cupy.cuda.set_allocator`` allocating from ``mr`` (default: the current
    resource of device 0) on CuPy's current stream. ``resource_of(fn)`` gives ``mr`` back.

    The allocator serves the device of ``mr``; allocating while another device is current raises
    ``ValueError`` (install one allocator per device with ``cupy.cuda.Device(i)`` blocks if needed).
    Over a :class:`~mrkit.PoolResource` the hooks CuPy calls are the pool's own hot path, in the
    variant that finds the stream itself and remembers each block's stream (no Python call of
    mrkit's in between); over any other resource they call its ``allocate``/``deallocate``.
    """
    cupy = _cupy()
    mr = mr or get_current_resource()
    if not mr.device_accessible:
        raise ValueError(f"{mr!r} is not device-accessible; use pinned_allocator() for host memory")
    device = mr.device_id or 0
    get_stream = cupy.cuda.get_current_stream
    cell, lookup = _stream_lookup()

    def wrong_device(device_id: int):
        raise ValueError(f"CuPy's current device is {device_id}, but this allocator serves device "
                         f"{device} ({mr!r})")

    def foreign_free(ptr: int) -> None:
        if not _exiting:
            raise ValueError(f"CuPy freed {ptr:#x}, which this allocator does not hold")

    hooks = hot_paths(mr, "hook", device=device, wrong_device=wrong_device, current_stream=get_stream,
                        seen=cell, remember=lookup, foreign_free=foreign_free)
    if hooks is None:
        hooks = _generic_hooks(mr, device, get_stream, cell, lookup, wrong_device, foreign_free)
    owner = _allocator_class(cupy.cuda.PythonFunctionAllocator)(*hooks)
    owner.resource = mr
    return owner.malloc  # CuPy calls this bound (compiled) method directly


def _generic_hooks(mr, device, get_stream, cell, lookup, wrong_device, foreign_free):
    """CuPy's ``malloc(nbytes, device_id)`` and ``free(ptr, device_id)`` over any resource."""
    alloc, dealloc = mr.allocate, mr.deallocate
    live: dict[int, tuple] = {}  # ptr -> (nbytes, stream): each entry written once and popped once

    def malloc(nbytes: int, device_id: int) -> int:
        if device_id != device:
            wrong_device(device_id)
        cs = get_stream(device_id)  # the id CuPy passes: spares CuPy a cudaGetDevice
        ref, s = cell[0]  # the stream lookup, inlined: this runs on every cupy allocation
        if ref() is not cs:
            s = lookup(cs)
        ptr = alloc(nbytes, s)
        live[ptr] = (nbytes, s)
        return ptr

    def free(ptr: int, device_id: int) -> None:
        entry = live.pop(ptr, None)
        if entry is None:
            return foreign_free(ptr)
        try:
            dealloc(ptr, entry[0], entry[1])
        except Exception:
            if not _exiting:
                raise
    return malloc, free


_classes: dict = {}


def _allocator_class(PFA):
    """A Python subclass of CuPy's PythonFunctionAllocator, so the allocator can name its resource."""
    cls = _classes.get(PFA)
    if cls is None:
        cls = _classes[PFA] = type("MrkitCupyAllocator", (PFA,), {"__module__": __name__})
    return cls


def resource_of(fn=None) -> MemoryResource | None:
    """The mrkit resource behind an allocator made by :func:`allocator` or :func:`pinned_allocator`
    (default: CuPy's current device allocator), or ``None`` when it is not one of mrkit's."""
    if fn is None:
        fn = _cupy().cuda.get_allocator()
    mr = getattr(fn, "resource", None)
    if mr is None:
        mr = getattr(getattr(fn, "__self__", None), "resource", None)
    return mr if isinstance(mr, MemoryResource) else None


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
        from ..resources import PinnedMemoryResource, PoolResource
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
