"""CuPy integration: mrkit resources as CuPy's device and pinned allocators.

CuPy is imported when first needed. Allocation happens on CuPy's current stream; CuPy gives no stream
when it frees, so each block is freed on the stream it was allocated on, when CuPy drops its last
reference.

The device allocator keeps CuPy's pool contract: every request is rounded up to 512 bytes
(:data:`ALLOCATION_UNIT`), that much is allocated, and ``mem.size`` says so. Each block is served by
the hooks of the current device's resource (``malloc(size, device_id)``) and goes back through the
free hook of the resource it came from, whatever happened to the current resource since. In the
compiled build CuPy calls the engine's C hooks through its ``CFunctionAllocator`` (no Python object
per block; CuPy's memory object is never cleared by the garbage collector). In the Python build a
block is CuPy's ``UnownedMemory`` owned by a :class:`CupyBlock`, whose finalizer frees it: Python runs
finalizers before the collector clears anything of a cycle, so a block in a garbage cycle is freed
once (CuPy's ``PythonFunctionAllocatorMemory`` would lose its free function to the collector's clear
and leak). Over a pool the hooks are the pool's hot path itself (see ``mrkit._engine``). Frees that
arrive while the interpreter exits are accepted silently and counted (:func:`late_frees`).
"""
from __future__ import annotations

import atexit
import threading
import weakref
from contextlib import contextmanager

from .. import _current
from .._current import get_current_resource
from .._resource import Buffer, MemoryResource
from .._errors import OutOfMemoryError
from .._stream import DEFAULT_STREAM, as_stream
from .._engine import c_hooks, hot_paths, rounded_size, rounding_call
from .._spec import build_resource, parse_spec
from ..driver import get_driver

__all__ = ["AllocatorHooks", "allocator", "pinned_allocator", "install", "install_pinned", "using_allocator",
           "resource_of", "ALLOCATION_UNIT", "late_frees"]

ALLOCATION_UNIT = 512
"""CuPy's allocation unit: like CuPy's pool, mrkit's allocator rounds every request up to a multiple of
it, allocates that much and reports it as ``mem.size`` (CuPy code may use the slack)."""

_exiting = [False]
_late = [0, 0]  # frees that arrived during interpreter exit: [accepted, of which could not be done]
_hooks_made: list = []
"""Every ``(malloc, free)`` pair handed to CuPy, kept for the life of the process. Each block's
owner (:class:`CupyBlock`) holds its free hook and calls it from its finalizer, which the collector
runs before it clears anything of a cycle; the hooks and the resources behind them are kept here so
that a finalizer never meets a half torn-down hook (as CuPy's own pools, they live until the
process ends)."""


_c_kept: list = []
"""Every C hook object (and its ``CFunctionAllocator``) handed to CuPy, kept for the life of the
process: CuPy's ``CFunctionAllocatorMemory`` keeps only the object's address and calls it when it dies,
however long after the allocator was replaced."""


def late_frees() -> tuple[int, int]:
    """``(accepted, not_done)``: frees CuPy made during interpreter exit (all accepted silently;
    ``not_done`` of them found mrkit already torn down, and their memory goes with the process)."""
    return _late[0], _late[1]


@atexit.register
def _at_exit() -> None:
    """From here on a free that fails is counted in :func:`late_frees`, not raised (CuPy frees what
    its memory objects still hold while the interpreter exits)."""
    _exiting[0] = True


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


def _foreign_free(ptr: int) -> None:
    if not _exiting[0]:
        raise ValueError(f"CuPy freed {ptr:#x}, which this allocator does not hold")


def _hooks(mr: MemoryResource, get_stream):
    """CuPy's ``(malloc(nbytes, device_id), free(ptr, device_id), holds(ptr), core)`` over ``mr``: the
    engine's own hook variant over a pool, else :func:`_generic_hooks` (``core`` is ``None``)."""
    cell, lookup = _stream_lookup()
    hooks = hot_paths(mr, "hook", current_stream=get_stream,
                      seen=cell, remember=lookup, foreign_free=_foreign_free)
    if hooks is None:
        hooks = _generic_hooks(mr, get_stream, cell, lookup)
    _hooks_made.append(hooks)
    return hooks


def _generic_hooks(mr: MemoryResource, get_stream, cell: list, lookup):
    """CuPy's hooks over any resource: its ``allocate``/``deallocate`` on the stream each block was
    allocated on (remembered until the block is freed)."""
    alloc, dealloc = mr.allocate, mr.deallocate
    live: dict = {}
    live_pop, foreign_free = live.pop, _foreign_free

    def malloc(nbytes, device_id):
        """Allocate ``nbytes`` from the resource on the caller's current CuPy stream of ``device_id``
        (the device these hooks serve: ``allocator``'s ``malloc`` picks the hooks by device)."""
        cs = get_stream(device_id)  # the id CuPy passes: spares CuPy a cudaGetDevice
        ref, s = cell[0]  # the stream lookup, inlined: this runs on every cupy allocation
        if ref() is not cs:
            s = lookup(cs)
        ptr = alloc(nbytes, s)
        live[ptr] = (nbytes, s)  # each entry written once and popped once
        return ptr

    def free(ptr, device_id):
        """Free ``ptr`` on the stream it was allocated on."""
        entry = live_pop(ptr, None)
        if entry is None:
            return foreign_free(ptr)
        dealloc(ptr, entry[0], entry[1])

    return malloc, free, live.__contains__, None


class CupyBlock:
    """The owner of one block handed to CuPy (``mem._owner`` of its ``UnownedMemory``): when CuPy drops
    the memory, ``__del__`` gives ``ptr`` back through ``free``, the hook of the resource it came from.
    Python runs finalizers of unreachable objects before the collector clears any of them, so this
    holds for a block in a garbage cycle too; ``free`` is one of the hooks kept for the process. During
    interpreter exit a free that fails is counted (:func:`late_frees`), never printed."""

    __slots__ = ("ptr", "device_id", "free")

    def __init__(self, ptr: int, device_id: int, free) -> None:
        self.ptr, self.device_id, self.free = ptr, device_id, free

    def __del__(self, _exiting=_exiting, _late=_late, _BaseException=BaseException) -> None:
        if not _exiting[0]:
            self.free(self.ptr, self.device_id)
            return
        _late[0] += 1
        try:
            self.free(self.ptr, self.device_id)
        except _BaseException:
            _late[1] += 1


def _c_route(cupy, table: dict, bind):
    """The compiled build's allocator entry point: CuPy's ``CFunctionAllocator`` calling the engine's
    C hooks (no Python object per block; CuPy's memory object is never cleared by the collector), with
    the 512-byte rounding in front; ``None`` in the Python build or with a CuPy older than 14 (whose
    C route cannot raise a typed error)."""
    cfa = getattr(cupy.cuda.memory, "CFunctionAllocator", None)
    try:
        major = int(str(getattr(cupy, "__version__", "0")).split(".")[0])
    except ValueError:
        major = 0
    if cfa is None or major < 14:
        return None
    hooks = c_hooks(table, bind, _hooks_made, _exiting, _late)
    if hooks is None:
        return None
    c_allocator = cfa(*hooks.addresses, hooks)
    _c_kept.append((hooks, c_allocator))  # CuPy's memory objects hold only the address of ``hooks``
    get_device_id = cupy.cuda.device.get_device_id

    def too_large(n: int):
        """A rounded size past C's ``size_t``, which CuPy's C route cannot take: the device's resource
        refuses it with its own OutOfMemoryError, naming the request and itself (as in the Python
        build)."""
        dev = get_device_id()
        m, f = (table.get(dev) or bind(dev))[:2]
        f(m(n, dev), dev)  # pragma: no cover - no device holds 2**64 bytes: a resource that lies
        raise OutOfMemoryError(f"{n} bytes is more than CuPy's allocator can take (C size_t)", n)

    entry = rounding_call(c_allocator.malloc, ALLOCATION_UNIT, too_large)
    entry.hooks = hooks
    return entry


def _python_route(hooks: "AllocatorHooks", get_device_id, Memory, Pointer, get_stream):
    """The entry point when CuPy's C route is not taken (the Python build, or a CuPy older than 14):
    each device's route, made on first use. Over a stock caching resource in the Python build it is
    the engine's one-frame route (``hot_paths(mr, "route")``: the block's owner frees it when CuPy drops
    the memory); else the device's hooks, each block owned by a :class:`CupyBlock`. A route is remade
    when its device's hooks are (the current resource was replaced). With a fixed resource the route
    of its device is CuPy's allocator itself; another device current is ``bind``'s ValueError."""
    table, bind, routes = hooks.table, hooks.bind, {}  # routes: device -> (hooks entry, route)

    def route_for(dev: int):
        entry = table.get(dev)
        if entry is None:
            entry = bind(dev)
        got = routes.get(dev)
        if got is not None and got[0] is entry:
            return got[1]
        cell, lookup = _stream_lookup()
        route = hot_paths(hooks.resource_for(dev), "route", device_id=dev, get_device=get_device_id,
                          elsewhere=elsewhere, current_stream=get_stream, seen=cell, remember=lookup,
                          memory=Memory, pointer=Pointer, unit=ALLOCATION_UNIT, exiting=_exiting, late=_late)
        if route is None:
            route = _hook_route(entry, dev, get_device_id, elsewhere, Memory, Pointer)
        routes[dev] = (entry, route)
        return route

    def elsewhere(size, dev):
        return route_for(dev)(size, dev)

    if hooks.resource is not None:
        return route_for(hooks.resource.device_id or 0)

    def malloc(size):
        dev = get_device_id()
        got = routes.get(dev)
        if got is None or table.get(dev) is not got[0]:  # first use, or the current resource was replaced
            return route_for(dev)(size, dev)
        return got[1](size, dev)  # the device read once

    malloc.rounding = ALLOCATION_UNIT
    return malloc


def _hook_route(entry: tuple, device_id: int, get_device_id, elsewhere, Memory, Pointer):
    """A route over one device's hooks ``(malloc, free, holds, core)``: each block owned by a
    :class:`CupyBlock` that gives it back through ``free``."""
    m, f = entry[0], entry[1]

    def route(size, dev=None):
        if dev is None:
            dev = get_device_id()
            if dev != device_id:
                return elsewhere(size, dev)
        n = rounded_size(size, ALLOCATION_UNIT)
        if n == 0:
            return Pointer(Memory(0, 0, None, dev), 0)
        ptr = m(n, dev)
        return Pointer(Memory(ptr, n, CupyBlock(ptr, dev, f), dev), 0)
    route.rounding = ALLOCATION_UNIT
    return route


class _Table(dict):
    """device -> (malloc hook, free hook, holds, core); a dict that can be weakly referenced."""

    __slots__ = ("__weakref__",)


class AllocatorHooks:
    """The CuPy-free half of :func:`allocator`: for each device, the ``(malloc(nbytes, device_id),
    free(ptr, device_id))`` hooks CuPy calls, over ``mr`` (its device only) or ``None`` (each device's
    current resource, followed when it is replaced). ``get_stream(device_id)`` gives the caller's
    current stream on that device (CuPy's ``get_current_stream``, or anything ``mrkit.as_stream``
    takes). The testing kit drives it without CuPy; :func:`allocator` hands its hooks to CuPy.

    :meth:`malloc` returns the pointer and the free hook of the resource that served it: as a CuPy
    memory object keeps its own free hook, a block goes back where it came from whatever is current
    when it dies."""

    def __init__(self, mr: MemoryResource | None = None, get_stream=None) -> None:
        if get_stream is None:
            get_stream = lambda device_id: DEFAULT_STREAM  # noqa: E731
        elif not callable(get_stream):
            raise TypeError(f"get_stream must be a callable(device_id) -> stream, not {type(get_stream).__name__}")
        self.resource = mr
        self.table = table = _Table()
        self._resources: dict = {}  # device -> the current resource its hooks were bound to (mr=None)
        if mr is not None:
            if not isinstance(mr, MemoryResource):
                raise TypeError(f"mr must be a MemoryResource or None, not {type(mr).__name__} "
                                "(install() also takes a factory or a spec string)")
            if not mr.device_accessible:
                raise ValueError(f"{mr!r} is not device-accessible; use pinned_allocator() for host memory")
            fixed = mr.device_id or 0
            table[fixed] = _hooks(mr, get_stream)

            def bind(dev: int):
                if dev == fixed:  # bound at construction: a caller that asks again gets them
                    return table[fixed]
                raise ValueError(f"CuPy's current device is {dev}, but this allocator serves device {fixed} "
                                 f"({mr!r}); use mrkit.cupy.allocator() (no resource) to follow each device")
        else:
            bind_lock, resources = threading.Lock(), self._resources

            def bind(dev: int):
                with bind_lock:
                    res = get_current_resource(dev)
                    if not res.device_accessible:
                        raise ValueError(f"the current resource of device {dev}, {res!r}, is not device-accessible")
                    hooks = table[dev] = _hooks(res, get_stream)
                    resources[dev] = res
                    return hooks
            ref = weakref.ref(table)

            def drop(dev: int) -> None:  # the current resource of ``dev`` was replaced
                t = ref()
                if t is None:
                    return False  # this allocator is gone: stop telling it
                t.pop(dev, None)
                resources.pop(dev, None)  # resource_for then names the new current resource
                return True
            _current.on_change(drop)
        self.bind = bind

    def hooks(self, device_id: int) -> tuple:
        """``(malloc, free, holds, core)`` serving ``device_id`` now (bound on first use)."""
        try:
            return self.table[device_id]
        except KeyError:
            return self.bind(device_id)

    def malloc(self, nbytes: int, device_id: int) -> tuple:
        """``(ptr, free)``: ``nbytes`` (already rounded, as CuPy's allocator does) for ``device_id``,
        and the hook that gives it back (``free(ptr, device_id)``)."""
        m, f, _, _ = self.hooks(device_id)
        return m(nbytes, device_id), f

    def resource_for(self, device_id: int) -> MemoryResource:
        """The resource serving ``device_id``."""
        if self.resource is not None:
            return self.resource
        return self._resources.get(device_id) or get_current_resource(device_id)


def allocator(mr: MemoryResource | None = None):
    """A function for ``cupy.cuda.set_allocator``: CuPy's ``malloc(size)`` served by mrkit on CuPy's
    current stream, with CuPy's pool contract (sizes rounded up to :data:`ALLOCATION_UNIT`, ``mem.size``
    the rounded size, ``size == 0`` gives a null pointer).

    ``mr=None``: one allocator for every device: CuPy's current device picks
    ``get_current_resource(device)`` (built on first use, from the factory given to :func:`install`,
    :func:`mrkit.reinitialize` or ``MRKIT_RESOURCE``), and follows it when it is replaced (blocks
    already handed out still go back where they came from). ``mr`` a resource: it serves its own
    device only; allocating while CuPy has another device current raises ``ValueError`` naming both.

    Over a :class:`~mrkit.PoolResource` the hooks CuPy calls are the pool's own hot path (see
    ``mrkit._engine``), remembering each block's stream; over any other resource they call its
    ``allocate``/``deallocate`` (:class:`AllocatorHooks`). ``resource_of(fn)`` names the resource
    serving the current device."""
    cupy = _cupy()
    memory = cupy.cuda.memory
    Memory, Pointer = memory.UnownedMemory, memory.MemoryPointer
    get_device_id = cupy.cuda.device.get_device_id
    hooks = AllocatorHooks(mr, cupy.cuda.get_current_stream)
    table, bind = hooks.table, hooks.bind

    c_route = _c_route(cupy, table, bind)
    if c_route is not None:
        malloc = c_route
    else:
        malloc = _python_route(hooks, get_device_id, Memory, Pointer, cupy.cuda.get_current_stream)
    malloc.resource = mr
    malloc.resource_for = hooks.resource_for
    malloc.hooks = hooks
    return malloc


def resource_of(fn=None) -> MemoryResource | None:
    """The mrkit resource behind an allocator made by :func:`allocator` (the one serving CuPy's current
    device) or :func:`pinned_allocator` (default: CuPy's current device allocator), or ``None`` when
    it is not one of mrkit's."""
    if fn is None:
        fn = _cupy().cuda.get_allocator()
    pick = getattr(fn, "resource_for", None)
    mr = pick(_cupy().cuda.device.get_device_id()) if pick is not None else getattr(fn, "resource", None)
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


def install(mr=None):
    """Make mrkit CuPy's global device allocator; returns the allocator installed.

    ``mr``: ``None`` (every device's current resource), a resource (its device only), a factory
    ``callable(device) -> MemoryResource`` or a spec string (``"statistics(pool(device))"``): these
    two become every device's current resource, built on first use (as ``mrkit.reinitialize(mr)``)."""
    if mr is not None and not isinstance(mr, MemoryResource):
        if not (isinstance(mr, str) or callable(mr)):
            raise TypeError(f"mr must be a MemoryResource, a factory, a spec string or None, not "
                            f"{type(mr).__name__}")
        if isinstance(mr, str):
            node, drv = parse_spec(mr), get_driver()
            mr = lambda device: build_resource(node, drv, device)  # noqa: E731
        _current.rebuild_all(mr)
        mr = None
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
