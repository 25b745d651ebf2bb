"""The CUDA backend: :class:`CudaDriver` over ``cuda.bindings.driver`` (cuda-bindings 12.x and 13.x).

Every call goes through :func:`_check` (or an inlined success test on the hot path followed by
:func:`_check` on failure), which turns a ``CUresult`` into :class:`~mrkit.CUDAError` carrying the
driver's error name, its explanation, the numeric code and the call; ``CUDA_ERROR_OUT_OF_MEMORY``
becomes :class:`~mrkit.OutOfMemoryError`. Loading the driver is deferred to the first use: with no
NVIDIA driver on the machine that first use raises :class:`~mrkit.CUDAUnavailableError`.

The 12.x/13.x differences live here alone: ``cuMemAdvise``/``cuMemPrefetchAsync`` take a
``CUmemLocation`` on 13.x and are spelt ``*_v2`` on 12.x.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

from .._errors import CUDAError, CUDAUnavailableError, OutOfMemoryError
from ._base import Driver

__all__ = ["CudaDriver"]

_ADVICE = {
    "set_read_mostly": "CU_MEM_ADVISE_SET_READ_MOSTLY",
    "unset_read_mostly": "CU_MEM_ADVISE_UNSET_READ_MOSTLY",
    "set_preferred_location": "CU_MEM_ADVISE_SET_PREFERRED_LOCATION",
    "unset_preferred_location": "CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION",
    "set_accessed_by": "CU_MEM_ADVISE_SET_ACCESSED_BY",
    "unset_accessed_by": "CU_MEM_ADVISE_UNSET_ACCESSED_BY",
}
_POOL_ATTR = {
    "reuse_follow_event_dependencies": ("CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES", False),
    "reuse_allow_opportunistic": ("CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC", False),
    "reuse_allow_internal_dependencies": ("CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES", False),
    "release_threshold": ("CU_MEMPOOL_ATTR_RELEASE_THRESHOLD", True),
    "reserved_mem_current": ("CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT", True),
    "reserved_mem_high": ("CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH", True),
    "used_mem_current": ("CU_MEMPOOL_ATTR_USED_MEM_CURRENT", True),
    "used_mem_high": ("CU_MEMPOOL_ATTR_USED_MEM_HIGH", True),
}
_CAPS = {
    "memory_pools_supported": "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
    "virtual_memory_management_supported": "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
    "managed_memory": "CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY",
    "concurrent_managed_access": "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
    "unified_addressing": "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",
    "pageable_memory_access": "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS",
    "compute_capability_major": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
    "compute_capability_minor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
    "multiprocessor_count": "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
}
_ACCESS = {
    "none": "CU_MEM_ACCESS_FLAGS_PROT_NONE",
    "read": "CU_MEM_ACCESS_FLAGS_PROT_READ",
    "readwrite": "CU_MEM_ACCESS_FLAGS_PROT_READWRITE",
}


def _load():
    """Import cuda.bindings and initialise the driver; map every loader failure to CUDAUnavailableError."""
    try:
        from cuda.bindings import driver as drv
    except ImportError as exc:  # the package itself is missing
        raise CUDAUnavailableError(
            "CUDA_BINDINGS_NOT_INSTALLED", None, "import cuda.bindings.driver",
            f"cuda-bindings is not installed ({exc}); install mrkit with its dependencies") from None
    try:
        (err,) = drv.cuInit(0)
    except RuntimeError as exc:  # cuda.pathfinder's DynamicLibNotFoundError and friends
        raise CUDAUnavailableError(
            "CUDA_DRIVER_NOT_FOUND", None, "cuInit",
            "no NVIDIA driver was found on this machine (libcuda could not be loaded: "
            f"{exc}). Use the simulated backend (MRKIT_BACKEND=sim) to run without a GPU") from None
    if err != drv.CUresult.CUDA_SUCCESS:
        name, expl = _names(drv, err)
        raise CUDAUnavailableError(name, int(err), "cuInit",
                                   f"{expl}; the CUDA driver is present but unusable")
    return drv


def _names(drv, err):
    try:
        e1, name = drv.cuGetErrorName(err)
        e2, expl = drv.cuGetErrorString(err)
        return (name.decode() if e1 == 0 else str(err)), (expl.decode() if e2 == 0 else "")
    except Exception:  # pragma: no cover - defensive
        return str(err), ""


_SIZE_T_MAX = (1 << 64) - 1


def _within_size_t(nbytes: int, call: str) -> None:
    """A request past C's ``size_t`` cannot reach the driver (cuda-bindings refuses to convert it,
    with an OverflowError): it is the driver's out-of-memory answer, naming the call and the request,
    as the simulator gives it."""
    if nbytes > _SIZE_T_MAX:
        raise OutOfMemoryError(f"{call}: the CUDA driver is out of memory for a request of {nbytes} bytes "
                               "(more than C's size_t holds)", nbytes, call)


class CudaDriver(Driver):
    """:class:`~mrkit.driver.Driver` over ``cuda.bindings.driver``. Construction is free; the
    driver library is loaded on first use."""

    name = "cuda"

    def __init__(self) -> None:
        self._drv = None
        self._lock = threading.RLock()  # _primary loads the driver while holding it
        self._ctx: dict[int, object] = {}  # device -> retained primary context
        self._ctx_int: dict[int, int] = {}
        self._event_dev: dict[int, int] = {}
        self._pool_dev: dict[int, int] = {}
        self._stream_dev: dict[int, int] = {}

    # -- plumbing -------------------------------------------------------------------------
    @property
    def d(self):
        drv = self._drv
        if drv is None:
            with self._lock:
                if self._drv is None:
                    self._drv = _load()
                drv = self._drv
        return drv

    def _check(self, res, call: str, nbytes: int | None = None):
        """The one checking function: returns the results after the CUresult, or raises."""
        err = res[0]
        if err == 0:
            n = len(res)
            return None if n == 1 else (res[1] if n == 2 else res[1:])
        drv = self.d
        name, expl = _names(drv, err)
        code = int(err)
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfMemoryError(
                f"{call}: the CUDA driver is out of memory"
                + (f" for a request of {nbytes} bytes" if nbytes is not None else "")
                + f" ({name}: {expl})", nbytes or 0, call)
        raise CUDAError(name, code, call, expl)

    def _enum(self, cls: str, member: str):
        return getattr(getattr(self.d, cls), member)

    def _location(self, location):
        d = self.d
        loc = d.CUmemLocation()
        if location == "host":
            loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
            loc.id = 0
        elif isinstance(location, int) and not isinstance(location, bool) and location >= 0:
            loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            loc.id = location
        else:
            raise ValueError(f"location must be a device ordinal or 'host', got {location!r}")
        return loc

    def _access_desc(self, dev: int, flags: str):
        if flags not in _ACCESS:
            raise ValueError(f"unsupported flags: {flags!r} (expected one of {sorted(_ACCESS)})")
        desc = self.d.CUmemAccessDesc()
        desc.location = self._location(dev)
        desc.flags = self._enum("CUmemAccess_flags", _ACCESS[flags])
        return desc

    # -- versions and devices --------------------------------------------------------------
    def driver_version(self) -> int:
        return int(self._check(self.d.cuDriverGetVersion(), "cuDriverGetVersion"))

    def runtime_version(self) -> int | None:
        """cudaRuntimeGetVersion (13000 for 13.0), or None when the runtime library is not available."""
        try:
            from cuda.bindings import runtime
            err, v = runtime.cudaRuntimeGetVersion()
        except Exception:  # noqa: BLE001 - the runtime library is optional
            return None
        return int(v) if int(err) == 0 else None

    def device_count(self) -> int:
        return int(self._check(self.d.cuDeviceGetCount(), "cuDeviceGetCount"))

    def _dev(self, dev: int):
        return self._check(self.d.cuDeviceGet(dev), "cuDeviceGet")

    def device_name(self, dev: int) -> str:
        raw = self._check(self.d.cuDeviceGetName(256, self._dev(dev)), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode()

    def device_total_mem(self, dev: int) -> int:
        return int(self._check(self.d.cuDeviceTotalMem(self._dev(dev)), "cuDeviceTotalMem"))

    def device_capability(self, dev: int, name: str) -> int:
        if name not in _CAPS:
            raise ValueError(f"unsupported capability: {name!r}")
        attr = self._enum("CUdevice_attribute", _CAPS[name])
        return int(self._check(self.d.cuDeviceGetAttribute(attr, self._dev(dev)), "cuDeviceGetAttribute"))

    # -- contexts --------------------------------------------------------------------------
    # mrkit never leaves a context switched behind the caller's back: every call that needs a
    # device runs inside ``_enter(dev)`` / ``_leave(prev)``, which makes ``dev``'s primary context
    # current only when it is not already (one cuCtxGetCurrent in the common case) and puts the
    # caller's context (or none) back afterwards. Calls on a *default* stream (handles 0, 1, 2) use
    # whatever context is current, as CUDA defines; a thread with none gets CUDA_ERROR_INVALID_CONTEXT
    # from the driver, and the call is retried once inside the context of the device that owns the
    # event or pointer involved (zero cost when it succeeds first time).
    def _primary(self, dev: int):
        ctx = self._ctx.get(dev)
        if ctx is None:
            with self._lock:
                ctx = self._ctx.get(dev)
                if ctx is None:
                    ctx = self._check(self.d.cuDevicePrimaryCtxRetain(self._dev(dev)),
                                      "cuDevicePrimaryCtxRetain")
                    self._ctx_int[dev] = int(ctx)
                    self._ctx[dev] = ctx
        return ctx

    def _enter(self, dev: int):
        """Make ``dev``'s primary context current; returns the context to restore, or None."""
        ctx = self._primary(dev)
        d = self._drv
        cur = d.cuCtxGetCurrent()[1]
        if int(cur) == self._ctx_int[dev]:
            return None
        self._check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return cur

    def _leave(self, prev) -> None:
        if prev is not None:
            self._check(self._drv.cuCtxSetCurrent(prev), "cuCtxSetCurrent")

    def _enter_any(self):
        """Some context current (device 0's primary if the thread has none); returns what to restore."""
        cur = self.d.cuCtxGetCurrent()[1]
        if int(cur) != 0:
            return None
        return self._enter(0)

    def _in(self, dev: int, fn, args, call: str, nbytes: int | None = None):
        """``fn(*args)`` checked, inside ``dev``'s context."""
        prev = self._enter(dev)
        try:
            return self._check(fn(*args), call, nbytes)
        finally:
            self._leave(prev)

    def _ptr_dev(self, ptr: int) -> int:
        """The device that owns ``ptr`` (0 when the driver cannot tell, e.g. host memory)."""
        d = self.d
        res = d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return int(res[1]) if res[0] == 0 and int(res[1]) >= 0 else 0

    def _on_stream(self, fn, args, call: str, stream: int, dev_of, nbytes: int | None = None):
        """``fn(*args)`` checked; on a default stream in a thread with no context, retried once in
        the context of ``dev_of()`` (the device owning the event or memory involved)."""
        res = fn(*args)
        if res[0] != 0 and int(res[0]) == 201 and stream in (0, 1, 2):
            return self._in(dev_of(), fn, args, call, nbytes)
        return self._check(res, call, nbytes)

    def ensure_context(self, dev: int) -> None:
        self._check(self.d.cuCtxSetCurrent(self._primary(dev)), "cuCtxSetCurrent")

    def current_device(self) -> int:
        d = self.d
        if int(d.cuCtxGetCurrent()[1]) == 0:
            return 0
        return int(self._check(d.cuCtxGetDevice(), "cuCtxGetDevice"))

    @contextlib.contextmanager
    def on_device(self, dev: int):
        prev = self._enter(dev)
        try:
            yield
        finally:
            self._leave(prev)

    def mem_get_info(self, dev: int) -> tuple[int, int]:
        free, total = self._in(dev, self.d.cuMemGetInfo, (), "cuMemGetInfo")
        return int(free), int(total)

    def ctx_synchronize(self, dev: int) -> None:
        self._in(dev, self.d.cuCtxSynchronize, (), "cuCtxSynchronize")

    def can_access_peer(self, dev: int, peer: int) -> bool:
        return bool(self._check(self.d.cuDeviceCanAccessPeer(self._dev(dev), self._dev(peer)),
                                "cuDeviceCanAccessPeer"))

    # -- streams and events ---------------------------------------------------------------
    def stream_create(self, dev: int, nonblocking: bool = True, priority: int = 0) -> int:
        flags = 1 if nonblocking else 0  # CU_STREAM_NON_BLOCKING
        h = int(self._in(dev, self.d.cuStreamCreateWithPriority, (flags, priority), "cuStreamCreateWithPriority"))
        self._stream_dev[h] = dev
        return h

    def stream_destroy(self, stream: int) -> None:
        self._check(self.d.cuStreamDestroy(stream), "cuStreamDestroy")
        self._stream_dev.pop(stream, None)

    def stream_synchronize(self, stream: int) -> None:
        # a default stream in a thread with no context: device 0's (the CUDA runtime's choice too)
        self._on_stream(self.d.cuStreamSynchronize, (stream,), "cuStreamSynchronize", stream, lambda: 0)

    def stream_query(self, stream: int) -> bool:
        res = self.d.cuStreamQuery(stream)
        if res[0] == self.d.CUresult.CUDA_ERROR_NOT_READY:
            return False
        self._check(res, "cuStreamQuery")
        return True

    def stream_get_id(self, stream: int) -> int:
        return int(self._check(self.d.cuStreamGetId(stream), "cuStreamGetId"))

    def stream_get_device(self, stream: int) -> int:
        dev = self._stream_dev.get(stream)
        if dev is not None:
            return dev
        d = self.d
        if stream in (0, 1, 2):
            return int(self._check(d.cuCtxGetDevice(), "cuCtxGetDevice"))
        if hasattr(d, "cuStreamGetDevice"):
            return int(self._check(d.cuStreamGetDevice(stream), "cuStreamGetDevice"))
        ctx = self._check(d.cuStreamGetCtx(stream), "cuStreamGetCtx")
        self._check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            return int(self._check(d.cuCtxGetDevice(), "cuCtxGetDevice"))
        finally:
            self._check(d.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._on_stream(self.d.cuStreamWaitEvent, (stream, event, 0), "cuStreamWaitEvent", stream,
                        lambda: self._event_dev.get(event, 0))

    def event_create(self, dev: int) -> int:
        ev = int(self._in(dev, self.d.cuEventCreate, (2,), "cuEventCreate"))  # CU_EVENT_DISABLE_TIMING
        self._event_dev[ev] = dev
        return ev

    def event_destroy(self, event: int) -> None:
        self._check(self.d.cuEventDestroy(event), "cuEventDestroy")
        self._event_dev.pop(event, None)

    def event_record(self, event: int, stream: int) -> None:
        self._on_stream(self.d.cuEventRecord, (event, stream), "cuEventRecord", stream,
                        lambda: self._event_dev.get(event, 0))

    def event_query(self, event: int) -> bool:
        res = self.d.cuEventQuery(event)
        if res[0] == self.d.CUresult.CUDA_ERROR_NOT_READY:
            return False
        self._check(res, "cuEventQuery")
        return True

    def event_synchronize(self, event: int) -> None:
        self._check(self.d.cuEventSynchronize(event), "cuEventSynchronize")

    # -- plain allocation --------------------------------------------------------------------
    def mem_alloc(self, dev: int, nbytes: int) -> int:
        _within_size_t(nbytes, "cuMemAlloc")
        return int(self._in(dev, self.d.cuMemAlloc, (nbytes,), "cuMemAlloc", nbytes))

    def mem_free(self, ptr: int) -> None:
        self._check(self.d.cuMemFree(ptr), "cuMemFree")

    def mem_host_alloc(self, nbytes, portable=True, devicemap=True, writecombined=False) -> int:
        _within_size_t(nbytes, "cuMemHostAlloc")
        flags = (1 if portable else 0) | (2 if devicemap else 0) | (4 if writecombined else 0)
        prev = self._enter_any()  # pinned memory needs a context, any context (portable)
        try:
            return int(self._check(self.d.cuMemHostAlloc(nbytes, flags), "cuMemHostAlloc", nbytes))
        finally:
            self._leave(prev)

    def mem_free_host(self, ptr: int) -> None:
        self._check(self.d.cuMemFreeHost(ptr), "cuMemFreeHost")

    def mem_alloc_managed(self, dev: int, nbytes: int, attach: str = "global") -> int:
        _within_size_t(nbytes, "cuMemAllocManaged")
        flags = {"global": 1, "host": 2}.get(attach)
        if flags is None:
            raise ValueError(f"unsupported attach: {attach!r} (expected 'global' or 'host')")
        return int(self._in(dev, self.d.cuMemAllocManaged, (nbytes, flags), "cuMemAllocManaged", nbytes))

    def mem_advise(self, ptr: int, nbytes: int, advice: str, location) -> None:
        if advice not in _ADVICE:
            raise ValueError(f"unsupported advice: {advice!r} (expected one of {sorted(_ADVICE)})")
        d = self.d
        adv = self._enum("CUmem_advise", _ADVICE[advice])
        loc = self._location(location)
        # cuMemAdvise needs a current context: the managed range's device's (a thread with none
        # got CUDA_ERROR_INVALID_CONTEXT on the H200)
        if hasattr(d, "cuMemAdvise_v2"):  # cuda-bindings 12.x: the location form is *_v2
            self._in(self._ptr_dev(ptr), d.cuMemAdvise_v2, (ptr, nbytes, adv, loc), "cuMemAdvise_v2")
        else:  # 13.x: cuMemAdvise takes a CUmemLocation
            self._in(self._ptr_dev(ptr), d.cuMemAdvise, (ptr, nbytes, adv, loc), "cuMemAdvise")

    def mem_prefetch_async(self, ptr: int, nbytes: int, location, stream: int) -> None:
        d = self.d
        loc = self._location(location)
        if hasattr(d, "cuMemPrefetchAsync_v2"):
            self._in(self._ptr_dev(ptr), d.cuMemPrefetchAsync_v2, (ptr, nbytes, loc, 0, stream), "cuMemPrefetchAsync_v2")
        else:
            self._in(self._ptr_dev(ptr), d.cuMemPrefetchAsync, (ptr, nbytes, loc, 0, stream), "cuMemPrefetchAsync")

    def pointer_info(self, ptr: int) -> dict:
        d = self.d
        A = d.CUpointer_attribute
        out = {}
        for key, attr in (("memory_type", A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE),
                          ("device_ordinal", A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL),
                          ("is_managed", A.CU_POINTER_ATTRIBUTE_IS_MANAGED),
                          ("range_start", A.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR),
                          ("range_size", A.CU_POINTER_ATTRIBUTE_RANGE_SIZE)):
            val = self._check(d.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute")
            out[key] = int(val)
        out["memory_type"] = {1: "host", 2: "device", 3: "array", 4: "unified"}.get(out["memory_type"], "unknown")
        out["is_managed"] = bool(out["is_managed"])
        return out

    # -- data movement ----------------------------------------------------------------------
    def memset_async(self, ptr, value, nbytes, stream) -> None:
        self._on_stream(self.d.cuMemsetD8Async, (ptr, value, nbytes, stream), "cuMemsetD8Async", stream,
                        lambda: self._ptr_dev(ptr))

    def memcpy_async(self, dst, src, nbytes, stream) -> None:
        self._on_stream(self.d.cuMemcpyAsync, (dst, src, nbytes, stream), "cuMemcpyAsync", stream,
                        lambda: self._ptr_dev(dst))

    def copy_to_host(self, ptr, nbytes, stream) -> bytes:
        buf = ctypes.create_string_buffer(nbytes)
        # in ptr's device context, whatever the stream: a thread with no context gets
        # CUDA_ERROR_INVALID_VALUE from a copy into pageable host memory (seen on the H200)
        prev = self._enter(self._ptr_dev(ptr))
        try:
            self._check(self.d.cuMemcpyDtoHAsync(ctypes.addressof(buf), ptr, nbytes, stream), "cuMemcpyDtoHAsync")
            self.stream_synchronize(stream)
        finally:
            self._leave(prev)
        return buf.raw

    def copy_from_host(self, ptr, data, stream) -> None:
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        prev = self._enter(self._ptr_dev(ptr))  # as in copy_to_host
        try:
            self._check(self.d.cuMemcpyHtoDAsync(ptr, ctypes.addressof(buf), len(data), stream), "cuMemcpyHtoDAsync")
            self.stream_synchronize(stream)  # the staging buffer must outlive the copy
        finally:
            self._leave(prev)

    def touch(self, ptr, nbytes, stream, write=True) -> None:
        # A real kernel needs no bookkeeping; a write is a memset so data checks see it, a read is free.
        if write:
            self.memset_async(ptr, 0, nbytes, stream)

    # -- stream-ordered allocator --------------------------------------------------------------
    def device_get_default_mem_pool(self, dev: int) -> int:
        pool = int(self._in(dev, self.d.cuDeviceGetDefaultMemPool, (self._dev(dev),), "cuDeviceGetDefaultMemPool"))
        self._pool_dev[pool] = dev
        return pool

    def device_get_mem_pool(self, dev: int) -> int:
        pool = int(self._in(dev, self.d.cuDeviceGetMemPool, (self._dev(dev),), "cuDeviceGetMemPool"))
        self._pool_dev[pool] = dev
        return pool

    def mem_pool_create(self, dev: int, max_size: int = 0, ipc_handle_type: str = "none") -> int:
        d = self.d
        props = d.CUmemPoolProps()
        props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location = self._location(dev)
        types = {"none": "CU_MEM_HANDLE_TYPE_NONE", "posix_fd": "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"}
        if ipc_handle_type not in types:
            raise ValueError(f"unsupported ipc_handle_type: {ipc_handle_type!r} (expected one of {sorted(types)})")
        props.handleTypes = self._enum("CUmemAllocationHandleType", types[ipc_handle_type])
        props.maxSize = max_size
        pool = int(self._in(dev, d.cuMemPoolCreate, (props,), "cuMemPoolCreate", max_size or None))
        self._pool_dev[pool] = dev
        return pool

    def mem_pool_destroy(self, pool: int) -> None:
        self._check(self.d.cuMemPoolDestroy(pool), "cuMemPoolDestroy")
        self._pool_dev.pop(pool, None)

    def mem_pool_get_attribute(self, pool: int, name: str) -> int:
        if name not in _POOL_ATTR:
            raise ValueError(f"unsupported pool attribute: {name!r}")
        attr = self._enum("CUmemPool_attribute", _POOL_ATTR[name][0])
        return int(self._check(self.d.cuMemPoolGetAttribute(pool, attr), "cuMemPoolGetAttribute"))

    def mem_pool_set_attribute(self, pool: int, name: str, value: int) -> None:
        if name not in _POOL_ATTR:
            raise ValueError(f"unsupported pool attribute: {name!r}")
        enum_name, is_size = _POOL_ATTR[name]
        d = self.d
        val = d.cuuint64_t(int(value)) if is_size else int(value)
        self._check(d.cuMemPoolSetAttribute(pool, self._enum("CUmemPool_attribute", enum_name), val),
                    "cuMemPoolSetAttribute")

    def mem_pool_trim_to(self, pool: int, min_bytes_to_keep: int) -> None:
        self._check(self.d.cuMemPoolTrimTo(pool, min_bytes_to_keep), "cuMemPoolTrimTo")

    def mem_pool_set_access(self, pool: int, dev: int, flags: str) -> None:
        self._check(self.d.cuMemPoolSetAccess(pool, [self._access_desc(dev, flags)], 1), "cuMemPoolSetAccess")

    def mem_pool_get_access(self, pool: int, dev: int) -> str:
        flags = int(self._check(self.d.cuMemPoolGetAccess(pool, self._location(dev)), "cuMemPoolGetAccess"))
        return {0: "none", 1: "read", 3: "readwrite"}.get(flags, str(flags))

    def mem_alloc_from_pool_async(self, nbytes: int, pool: int, stream: int) -> int:
        _within_size_t(nbytes, "cuMemAllocFromPoolAsync")
        res = self.d.cuMemAllocFromPoolAsync(nbytes, pool, stream)
        if res[0] == 0:
            return int(res[1])
        if int(res[0]) == 201 and stream in (0, 1, 2):  # a default stream in a thread with no context
            return int(self._in(self._pool_dev.get(pool, 0), self.d.cuMemAllocFromPoolAsync,
                                (nbytes, pool, stream), "cuMemAllocFromPoolAsync", nbytes))
        return int(self._check(res, "cuMemAllocFromPoolAsync", nbytes))

    def mem_free_async(self, ptr: int, stream: int) -> None:
        res = self.d.cuMemFreeAsync(ptr, stream)
        if res[0] != 0:
            if int(res[0]) == 201 and stream in (0, 1, 2):  # a default stream in a thread with no context
                return self._in(self._ptr_dev(ptr), self.d.cuMemFreeAsync, (ptr, stream), "cuMemFreeAsync")
            self._check(res, "cuMemFreeAsync")

    def mem_pool_export_to_shareable_handle(self, pool: int) -> int:
        t = self._enum("CUmemAllocationHandleType", "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")
        return int(self._check(self.d.cuMemPoolExportToShareableHandle(pool, t, 0),
                               "cuMemPoolExportToShareableHandle"))

    def mem_pool_import_from_shareable_handle(self, handle: int) -> int:
        t = self._enum("CUmemAllocationHandleType", "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")
        prev = self._enter_any()
        try:
            return int(self._check(self.d.cuMemPoolImportFromShareableHandle(handle, t, 0),
                                   "cuMemPoolImportFromShareableHandle"))
        finally:
            self._leave(prev)

    def mem_pool_export_pointer(self, ptr: int) -> bytes:
        data = self._check(self.d.cuMemPoolExportPointer(ptr), "cuMemPoolExportPointer")
        return ctypes.string_at(data.getPtr(), 64)

    def mem_pool_import_pointer(self, pool: int, data: bytes) -> int:
        if len(data) != 64:
            raise ValueError(f"data must be the 64 bytes of an exported pointer, got {len(data)}")
        share = self.d.CUmemPoolPtrExportData()
        ctypes.memmove(share.getPtr(), bytes(data), 64)
        return int(self._check(self.d.cuMemPoolImportPointer(pool, share), "cuMemPoolImportPointer"))

    # -- virtual memory management ------------------------------------------------------------
    _VMM_HANDLE = {"none": "CU_MEM_HANDLE_TYPE_NONE", "posix_fd": "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
                   "win32": "CU_MEM_HANDLE_TYPE_WIN32", "fabric": "CU_MEM_HANDLE_TYPE_FABRIC"}

    def _alloc_prop(self, dev: int, handle_type: str = "none"):
        d = self.d
        if handle_type not in self._VMM_HANDLE:
            raise ValueError(f"handle_type must be one of {list(self._VMM_HANDLE)}, got {handle_type!r}")
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = self._location(dev)
        prop.requestedHandleTypes = self._enum("CUmemAllocationHandleType", self._VMM_HANDLE[handle_type])
        return prop

    def mem_get_allocation_granularity(self, dev: int, recommended: bool = False, handle_type: str = "none") -> int:
        flag = self._enum("CUmemAllocationGranularity_flags",
                          "CU_MEM_ALLOC_GRANULARITY_RECOMMENDED" if recommended else "CU_MEM_ALLOC_GRANULARITY_MINIMUM")
        return int(self._check(self.d.cuMemGetAllocationGranularity(self._alloc_prop(dev, handle_type), flag),
                               "cuMemGetAllocationGranularity"))

    def mem_create(self, dev: int, nbytes: int, handle_type: str = "none") -> int:
        _within_size_t(nbytes, "cuMemCreate")
        return int(self._in(dev, self.d.cuMemCreate, (nbytes, self._alloc_prop(dev, handle_type), 0), "cuMemCreate", nbytes))

    def mem_release(self, handle: int) -> None:
        self._check(self.d.cuMemRelease(handle), "cuMemRelease")

    def mem_address_reserve(self, nbytes: int, alignment: int = 0) -> int:
        _within_size_t(nbytes, "cuMemAddressReserve")
        prev = self._enter_any()
        try:
            return int(self._check(self.d.cuMemAddressReserve(nbytes, alignment, 0, 0), "cuMemAddressReserve", nbytes))
        finally:
            self._leave(prev)

    def mem_address_free(self, ptr: int, nbytes: int) -> None:
        self._check(self.d.cuMemAddressFree(ptr, nbytes), "cuMemAddressFree")

    def mem_map(self, ptr: int, nbytes: int, offset: int, handle: int) -> None:
        self._check(self.d.cuMemMap(ptr, nbytes, offset, handle, 0), "cuMemMap")

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        self._check(self.d.cuMemUnmap(ptr, nbytes), "cuMemUnmap")

    def mem_set_access(self, ptr: int, nbytes: int, dev: int, flags: str = "readwrite") -> None:
        self._check(self.d.cuMemSetAccess(ptr, nbytes, [self._access_desc(dev, flags)], 1), "cuMemSetAccess")
