"""PyTorch integration: mrkit resources behind PyTorch's CUDA allocator.

PyTorch's pluggable-allocator API wants two C functions, ``void* alloc(size_t size, int device,
cudaStream_t stream)`` and ``void free(void* ptr, size_t size, int device, cudaStream_t stream)``.
``torch.cuda.memory.CUDAPluggableAllocator`` finds them in a shared library by name; mrkit hands
their addresses to the same internal constructor that class calls,
``torch._C._cuda_customAllocator(alloc_ptr, free_ptr)``. In the compiled build they are C functions
of mrkit's extension (one pair per allocator, up to 64 in a process); in the Python build, or past
64, ``ctypes.CFUNCTYPE`` trampolines. Either calls :class:`AllocatorCallbacks`.
That private function, ``torch.cuda.MemPool`` / ``torch.cuda.use_mem_pool`` (scoped use) and
``torch._C._cuda_beginAllocateToPool`` (process-wide use: every stream of a device to one pool) are
the PyTorch internals relied on; where one
is missing :func:`allocator` / :func:`pool` / :func:`install` raise ``RuntimeError`` naming it.

Two ways to use it:

* :func:`pool` (preferred): ``with mrkit.torch.pool(mr):`` — PyTorch keeps its caching allocator and
  mrkit supplies its segments (a ``torch.cuda.MemPool`` with mrkit as its allocator). When mrkit
  cannot allocate (after its pool's own reclaim), PyTorch frees its cache, retries, and raises a typed
  ``torch.cuda.OutOfMemoryError`` (mrkit's reason is added as a note). PyTorch's statistics
  (``torch.cuda.memory_stats``) and snapshots keep working.
* :func:`install`: the same ``MemPool``, one per device, made the destination of every allocation of
  the process (every thread and stream), at any time. A refusal is a typed
  ``torch.cuda.OutOfMemoryError``, never a null pointer.

Blocks are stream-ordered on the stream PyTorch passes, and freed on the stream they were allocated
on. The callbacks take the GIL; see docs/guide.md for the lock-order note (tested with two threads).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import threading
from contextlib import contextmanager

from .._current import get_current_resource
from .._engine import drain_torch_frees
from .._engine import torch_callbacks as c_callbacks
from .._resource import MemoryResource
from .._stream import DEFAULT_STREAM, Stream

__all__ = ["AllocatorCallbacks", "TorchAllocator", "allocator", "pool", "install", "apply_queued_frees",
           "RELEASE_SPLIT_MB"]

RELEASE_SPLIT_MB = 32
"""PyTorch's ``max_split_size_mb`` that :func:`pool` and :func:`install` set in the compiled build
(unless ``PYTORCH_CUDA_ALLOC_CONF``/``PYTORCH_ALLOC_CONF`` sets one): PyTorch then gives cached free
segments of at least this size back to mrkit before an out-of-memory refusal stands, which it never
does for a ``MemPool`` in use otherwise. ``None`` (set before the first ``pool()``/``install()``)
leaves PyTorch's setting alone."""

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_keep: list = []  # every allocator and MemPool handed to PyTorch (see _keep_forever)


def _keep_forever(obj) -> None:
    """Keep ``obj`` alive through the interpreter's exit, never collected. PyTorch may call mrkit's
    callbacks as late as it likes (a MemPool freed gives its segments back through them): a ``ctypes``
    callback freed first made that a jump to freed memory, a segmentation fault at exit. MemPools are
    kept too, so none is freed while modules are being torn down (the driver reclaims the memory
    when the process ends)."""
    _keep.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))  # one reference no teardown drops


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("mrkit.torch needs PyTorch: pip install torch") from exc
    return torch


def _internal(torch, dotted: str):
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            raise RuntimeError(f"this PyTorch ({getattr(torch, '__version__', '?')}) has no {dotted}, which "
                               "mrkit.torch relies on (PyTorch 2.5 or newer has it)")
    return obj


class AllocatorCallbacks:
    """The Python side of PyTorch's pluggable allocator, without PyTorch: ``alloc(size, device,
    stream)`` and ``free(ptr, size, device, stream)`` exactly as PyTorch calls them, over ``mr`` (one
    resource, its device only) or ``None`` (the current resource of the device asked for). A block
    goes back to the resource that allocated it, on the stream it was allocated on, whatever is current
    when it is freed. The testing kit drives these; :class:`TorchAllocator` hands them to PyTorch.

    ``live_bytes`` is what is held through them now; ``failures`` allocations refused, ``last_error``
    the latest reason; ``foreign_frees`` frees of pointers they never handed out (ignored: a C callback
    cannot raise)."""

    def __init__(self, mr: MemoryResource | None = None) -> None:
        if mr is not None:
            if not isinstance(mr, MemoryResource):
                raise TypeError(f"mr must be a MemoryResource or None, not {type(mr).__name__}")
            if not mr.device_accessible:
                raise ValueError(f"{mr!r} is not device-accessible")
        self.resource = mr
        self._live: dict[int, tuple] = {}  # ptr -> (resource, nbytes, stream)
        self._streams: dict[int, Stream] = {}
        self._lock = threading.Lock()
        self.live_bytes = 0
        self.failures = 0
        self.foreign_frees = 0
        self.last_error: BaseException | None = None

    def _stream(self, handle: int | None) -> Stream:
        if not handle:
            return DEFAULT_STREAM
        s = self._streams.get(handle)
        if s is None:  # PyTorch's streams come from pools it never destroys: remember each once
            s = self._streams[handle] = Stream.wrap(handle)
        return s

    def alloc(self, size, device, stream):
        """PyTorch's ``alloc``: a pointer, or NULL (PyTorch then frees its cache and retries or raises)."""
        try:
            mr = self.resource if self.resource is not None else get_current_resource(device)
            if self.resource is not None and (mr.device_id or 0) != device:
                raise ValueError(f"PyTorch asked for device {device}, but this allocator serves device "
                                 f"{mr.device_id or 0} ({mr!r})")
            s = self._stream(stream)
            ptr = mr.allocate(size, s)
        except BaseException as exc:  # noqa: BLE001 - nothing may escape a C callback
            with self._lock:
                self.failures += 1
                self.last_error = exc
            return None
        with self._lock:
            self._live[ptr] = (mr, size, s)
            self.live_bytes += size
        return ptr

    def free(self, ptr, size, device, stream):
        """PyTorch's ``free``: the block goes back to its resource, on the stream it was allocated on."""
        with self._lock:
            entry = self._live.pop(ptr or 0, None)
            if entry is None:
                self.foreign_frees += 1
                return
            self.live_bytes -= entry[1]
        try:
            entry[0].deallocate(ptr, entry[1], entry[2])
        except BaseException as exc:  # noqa: BLE001 - nothing may escape a C callback
            self.last_error = exc

    def __repr__(self) -> str:
        what = repr(self.resource) if self.resource is not None else "the current resource of each device"
        return f"<mrkit.torch allocator over {what}: {self.live_bytes} bytes live>"


class TorchAllocator(AllocatorCallbacks):
    """mrkit's resources as a PyTorch CUDA allocator: :class:`AllocatorCallbacks` made C-callable
    (the compiled build's C functions, else ``ctypes``) and handed to PyTorch. ``allocator`` is
    PyTorch's allocator object (for ``torch.cuda.MemPool(...)``); ``addresses`` the two functions'.
    ``queues_frees``: the compiled build's C functions, whose frees from a thread without the GIL are
    queued (see :func:`apply_queued_frees`) instead of waiting for the GIL."""

    def __init__(self, mr: MemoryResource | None = None) -> None:
        torch = _torch()
        make = _internal(torch, "torch._C._cuda_customAllocator")
        super().__init__(mr)
        self.addresses = c_callbacks(self)  # the compiled build's C functions
        self.queues_frees = self.addresses is not None  # frees without the GIL are queued, not waited on
        if self.addresses is None:  # the Python build (or every C slot taken): ctypes trampolines
            self._c_alloc, self._c_free = _ALLOC(self.alloc), _FREE(self.free)
            self.addresses = (ctypes.cast(self._c_alloc, ctypes.c_void_p).value,
                              ctypes.cast(self._c_free, ctypes.c_void_p).value)
            _keep_forever(self._c_alloc)
            _keep_forever(self._c_free)
        self.allocator = make(*self.addresses)
        _keep_forever(self)


def allocator(mr: MemoryResource | None = None) -> TorchAllocator:
    """A :class:`TorchAllocator` over ``mr`` (default: the current resource of each device)."""
    return TorchAllocator(mr)


@contextmanager
def pool(mr: MemoryResource | None = None, *, device=None):
    """``with mrkit.torch.pool(mr) as p:`` — PyTorch allocations on ``device`` (default: the current
    one) inside the block come from a ``torch.cuda.MemPool`` whose segments mrkit supplies. Yields the
    ``MemPool`` (its ``.mrkit`` attribute is the :class:`TorchAllocator`). Tensors made inside stay
    valid after the block."""
    torch = _torch()
    MemPool = _internal(torch, "torch.cuda.MemPool")
    use_mem_pool = _internal(torch, "torch.cuda.use_mem_pool")
    alloc = allocator(mr)
    _configure(torch, alloc)
    mp = MemPool(alloc.allocator)
    mp.mrkit = alloc
    _keep_forever(mp)  # PyTorch frees the pool's segments through mrkit when it empties it, even later
    try:
        with use_mem_pool(mp, device=device):
            yield mp
    except torch.cuda.OutOfMemoryError as exc:
        if alloc.last_error is not None and hasattr(exc, "add_note"):
            exc.add_note(f"mrkit: {alloc.last_error}")
        raise


def _configure(torch, alloc: "TorchAllocator") -> None:
    """PyTorch's allocator settings mrkit needs (process-wide; the user's own settings are kept):

    * ``release_lock_on_cudamalloc``: PyTorch drops its lock while it gets a new segment, so mrkit's
      callback, which needs the GIL, never waits for it while holding that lock, which a thread
      freeing a tensor under the GIL may be waiting for;
    * ``max_split_size_mb`` (:data:`RELEASE_SPLIT_MB`, compiled build only): when mrkit refuses a
      segment, PyTorch gives cached free segments of the pool in use back and retries before it
      raises. It frees them under its lock, from a thread that may not hold the GIL: the compiled
      build's free callback queues such frees without waiting for the GIL (they are applied before
      the retry's allocation). The Python build's ``ctypes`` callback must take the GIL, which could
      deadlock there, so it leaves this setting alone."""
    settings = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # PyTorch >= 2.9
    if settings is None:  # older PyTorch (the name above deprecates this one)
        settings = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)
    if settings is None:
        return
    user = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    parts = [p for p in user.split(",") if p.strip()]  # restated: a settings call may reset the rest
    parts.append("release_lock_on_cudamalloc:True")
    if alloc.queues_frees and RELEASE_SPLIT_MB and "max_split_size_mb" not in user:
        parts.append(f"max_split_size_mb:{RELEASE_SPLIT_MB}")
    settings(",".join(parts))


def apply_queued_frees() -> int:
    """Apply the frees PyTorch made from threads without the GIL that the compiled build queued (they
    are applied anyway before the next allocation and soon after on the main thread); the number."""
    return drain_torch_frees()


atexit.register(drain_torch_frees)


def install(mr: MemoryResource | None = None) -> TorchAllocator:
    """Route every PyTorch CUDA allocation of the process — every thread, every stream — to mrkit:
    ``mr``'s device, or with ``mr=None`` every device (each from its current resource).

    Built on the same ``torch.cuda.MemPool`` as :func:`pool`, one per device, made the destination of
    all allocations on that device (``torch._C._cuda_beginAllocateToPool``), so PyTorch keeps its
    caching allocator in front: its statistics and snapshots describe the memory, and a refusal by
    mrkit is a typed ``torch.cuda.OutOfMemoryError`` — never a null pointer (the replaced-allocator
    route this function used before handed PyTorch ``NULL`` and the first write lost the CUDA
    context). Tensors PyTorch made before the call stay valid and go back to PyTorch's own pool.
    Returns the :class:`TorchAllocator` (its ``pools`` are the ``MemPool`` of each device)."""
    torch = _torch()
    MemPool = _internal(torch, "torch.cuda.MemPool")
    begin = _internal(torch, "torch._C._cuda_beginAllocateToPool")
    alloc = allocator(mr)
    _configure(torch, alloc)
    devices = [mr.device_id or 0] if mr is not None else list(range(torch.cuda.device_count()))
    alloc.pools = []
    for d in devices:
        with torch.cuda.device(d):
            mp = MemPool(alloc.allocator)
        mp.mrkit = alloc
        begin(d, mp.id)
        alloc.pools.append(mp)
    _keep_forever(alloc.pools)  # routed for the rest of the process: the pools must outlive it
    return alloc
