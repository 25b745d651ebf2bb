"""``DeviceMemoryResource``: stream-ordered allocation from a driver memory pool, and ``MemoryPool``."""
from __future__ import annotations

from dataclasses import dataclass

from .._errors import CUDAError, OutOfMemoryError
from .._owned import Closing, Owned, give_back_dropped, give_back_when_dropped
from .._resource import DEFAULT_ALIGNMENT, MemoryResource, check_device, check_pointer, check_request, closed_resource, \
    still_live
from .._sizes import format_size, parse_size
from .._stream import DEFAULT_STREAM, Stream, as_stream, device_scope
from ..driver import POOL_ATTRIBUTES, Driver, get_driver
from ._common import LiveTable

__all__ = ["DeviceMemoryResource", "DeviceMemoryResourceOptions", "MemoryPool"]

_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class DeviceMemoryResourceOptions:
    """How :class:`DeviceMemoryResource` creates a pool of its own (``cuMemPoolCreate``).

    initial_size: bytes allocated and returned at creation so the pool starts with them reserved.
    max_size: the pool's cap (0: the driver's default, about the device's memory).
    release_threshold: reserved bytes the pool keeps across synchronisations; ``None`` keeps
        everything (``2**64 - 1``), which is what makes a pool fast.
    reuse_follow_event_dependencies, reuse_allow_opportunistic, reuse_allow_internal_dependencies:
        the driver's three reuse policies (all enabled by default, as in the driver).
    ipc_handle_type: ``"none"`` or ``"posix_fd"`` (to share the pool with other processes).
    """

    initial_size: int | str = 0
    max_size: int | str = 0
    release_threshold: int | str | None = None
    reuse_follow_event_dependencies: bool = True
    reuse_allow_opportunistic: bool = True
    reuse_allow_internal_dependencies: bool = True
    ipc_handle_type: str = "none"

    def __post_init__(self):
        for f in ("initial_size", "max_size"):
            object.__setattr__(self, f, parse_size(getattr(self, f), f))
        if self.release_threshold is not None:
            object.__setattr__(self, "release_threshold", parse_size(self.release_threshold, "release_threshold"))
        if self.ipc_handle_type not in ("none", "posix_fd"):
            raise ValueError(f"unsupported ipc_handle_type: {self.ipc_handle_type!r} (expected 'none' or 'posix_fd')")
        if self.max_size and self.initial_size > self.max_size:
            raise ValueError(f"initial_size {self.initial_size} exceeds max_size {self.max_size}")


def _destroy_dropped(drv: Driver, device: int, handle: int) -> None:
    """Destroy a pool collected without ``close()``, once the device is idle (no free still queued)."""
    drv.ctx_synchronize(device)
    drv.mem_pool_destroy(handle)


class MemoryPool(Closing, Owned):
    """A driver memory pool: attributes, trimming, access from other devices and IPC.

    A pool mrkit created (``owned``) may be configured freely and is destroyed by :meth:`close`.
    A device's default or current pool is shared by the whole process (CuPy's and PyTorch's async
    allocators use it too): changing its attributes or access affects everyone, so the setters
    refuse unless called with ``process_wide=True``.
    """

    __slots__ = ("handle", "device", "driver", "owned", "imported", "_closed", "_on_drop", "__weakref__")
    _pickle_advice = "; share it with export_handle() and MemoryPool.from_shareable_handle()"

    def __init__(self, handle: int, device: int, driver: Driver, owned: bool, imported: bool = False) -> None:
        self.handle, self.device, self.driver = handle, device, driver
        self.owned, self.imported, self._closed = owned, imported, False
        self._on_drop = None  # an owned pool's finalizer: destroys it once collected without close()

    @classmethod
    def default(cls, device: int = 0, *, driver: Driver | None = None) -> "MemoryPool":
        drv = driver or get_driver()
        return cls(drv.device_get_default_mem_pool(device), device, drv, owned=False)

    @classmethod
    def current(cls, device: int = 0, *, driver: Driver | None = None) -> "MemoryPool":
        drv = driver or get_driver()
        return cls(drv.device_get_mem_pool(device), device, drv, owned=False)

    @classmethod
    def create(cls, device: int = 0, options: DeviceMemoryResourceOptions | None = None, *,
               driver: Driver | None = None) -> "MemoryPool":
        """Create and configure a pool. If any step fails, the pool is destroyed before the error
        propagates: nothing is left half-built."""
        opts = options or DeviceMemoryResourceOptions()
        drv = driver or get_driver()
        give_back_dropped()  # pools (and caching resources) collected without close() go first
        handle = drv.mem_pool_create(device, opts.max_size, opts.ipc_handle_type)
        pool = cls(handle, device, drv, owned=True)
        try:
            threshold = _U64_MAX if opts.release_threshold is None else opts.release_threshold
            drv.mem_pool_set_attribute(handle, "release_threshold", threshold)
            drv.mem_pool_set_attribute(handle, "reuse_follow_event_dependencies", int(opts.reuse_follow_event_dependencies))
            drv.mem_pool_set_attribute(handle, "reuse_allow_opportunistic", int(opts.reuse_allow_opportunistic))
            drv.mem_pool_set_attribute(handle, "reuse_allow_internal_dependencies", int(opts.reuse_allow_internal_dependencies))
            if opts.initial_size:
                stream = drv.stream_create(device, True, 0)
                try:
                    ptr = drv.mem_alloc_from_pool_async(opts.initial_size, handle, stream)
                    drv.mem_free_async(ptr, stream)
                    drv.stream_synchronize(stream)
                finally:
                    drv.stream_destroy(stream)
        except BaseException:
            drv.mem_pool_destroy(handle)
            raise
        # collected without close(): destroyed at the next construction, after a device wait
        pool._on_drop = give_back_when_dropped(pool, _destroy_dropped, drv, device, handle)
        return pool

    @classmethod
    def from_shareable_handle(cls, handle: int, device: int = 0, *, driver: Driver | None = None) -> "MemoryPool":
        """Open a pool exported by another process (:meth:`export_handle`). Imported pools cannot
        allocate; use :meth:`import_pointer` to map the exporter's allocations."""
        drv = driver or get_driver()
        return cls(drv.mem_pool_import_from_shareable_handle(handle), device, drv, owned=False, imported=True)

    # -- attributes ---------------------------------------------------------------------
    def get_attribute(self, name: str) -> int:
        if name not in POOL_ATTRIBUTES:
            raise ValueError(f"unsupported pool attribute: {name!r} (expected one of {list(POOL_ATTRIBUTES)})")
        return self.driver.mem_pool_get_attribute(self._live(), name)

    def set_attribute(self, name: str, value, *, process_wide: bool = False) -> None:
        if name not in POOL_ATTRIBUTES:
            raise ValueError(f"unsupported pool attribute: {name!r} (expected one of {list(POOL_ATTRIBUTES)})")
        self._may_modify(process_wide)
        self.driver.mem_pool_set_attribute(self._live(), name, parse_size(value, name) if isinstance(value, str) else int(value))

    @property
    def attributes(self) -> dict:
        """Every attribute the driver reference documents, as a dict."""
        return {name: self.get_attribute(name) for name in POOL_ATTRIBUTES}

    reserved_mem_current = property(lambda self: self.get_attribute("reserved_mem_current"),
                                    doc="Backing memory currently allocated for the pool.")
    reserved_mem_high = property(lambda self: self.get_attribute("reserved_mem_high"),
                                 doc="High watermark of reserved memory since the last reset.")
    used_mem_current = property(lambda self: self.get_attribute("used_mem_current"),
                                doc="Memory from the pool currently in use by the application.")
    used_mem_high = property(lambda self: self.get_attribute("used_mem_high"),
                             doc="High watermark of used memory since the last reset.")
    release_threshold = property(lambda self: self.get_attribute("release_threshold"),
                                 doc="Reserved bytes kept across synchronisations.")

    def reset_high_watermarks(self, *, process_wide: bool = False) -> None:
        """Reset ``reserved_mem_high`` and ``used_mem_high`` to the current values."""
        self._may_modify(process_wide)
        self.driver.mem_pool_set_attribute(self._live(), "reserved_mem_high", 0)
        self.driver.mem_pool_set_attribute(self.handle, "used_mem_high", 0)

    def trim_to(self, min_bytes_to_keep: int | str = 0) -> None:
        """Give unused memory back to the OS until at most ``min_bytes_to_keep`` stay reserved
        (frees not yet observed complete may still count as in use)."""
        self.driver.mem_pool_trim_to(self._live(), parse_size(min_bytes_to_keep, "min_bytes_to_keep"))

    # -- access from other devices -----------------------------------------------------------
    def enable_access_from(self, device: int, flags: str = "readwrite", *, process_wide: bool = False) -> None:
        """Let ``device`` access the pool's memory (``cuMemPoolSetAccess``); ``flags`` is
        ``"readwrite"``, ``"read"`` or ``"none"`` (to revoke)."""
        self._may_modify(process_wide)
        self.driver.mem_pool_set_access(self._live(), device, flags)

    def is_accessible_from(self, device: int) -> bool:
        return self.driver.mem_pool_get_access(self._live(), device) != "none"

    def access_from(self, device: int) -> str:
        return self.driver.mem_pool_get_access(self._live(), device)

    # -- IPC -------------------------------------------------------------------------------
    def export_handle(self) -> int:
        """A POSIX file descriptor naming this pool, to pass to another process (the pool must have
        been created with ``ipc_handle_type="posix_fd"``)."""
        return self.driver.mem_pool_export_to_shareable_handle(self._live())

    def export_pointer(self, ptr: int) -> bytes:
        """64 bytes describing an allocation of this pool, to send to an importing process."""
        return self.driver.mem_pool_export_pointer(ptr)

    def import_pointer(self, data: bytes) -> int:
        """Map an allocation exported by the owning process into this (imported) pool."""
        return self.driver.mem_pool_import_pointer(self._live(), bytes(data))

    def close(self) -> None:
        """Destroy an owned pool, once the device is idle (frees still queued complete first);
        ``ValueError``, destroying nothing, while the driver counts memory of the pool in use (the driver
        would allow it, freeing those blocks as they are freed; mrkit does not rely on it). An owned
        pool collected without ``close()`` is destroyed when the next pool or caching resource is built."""
        if self.owned and not self._closed:
            drv = self.driver
            drv.ctx_synchronize(self.device)
            used = drv.mem_pool_get_attribute(self.handle, "used_mem_current")
            if used:
                raise ValueError(f"{self!r} still has {used} bytes in use; free them before close()")
            self._closed = True
            if self._on_drop is not None:
                self._on_drop.detach()
            drv.mem_pool_destroy(self.handle)

    def _live(self) -> int:
        """The handle, for a driver call; ``ValueError`` once :meth:`close` destroyed the pool."""
        if self._closed:
            raise ValueError(f"{self!r} is closed: the driver destroyed it")
        return self.handle

    def _may_modify(self, process_wide: bool) -> None:
        if not self.owned and not process_wide:
            raise ValueError(f"{self!r} is shared by the whole process (CuPy, PyTorch and others use "
                             "it too); pass process_wide=True to change it anyway")

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryPool) and other.handle == self.handle and other.driver is self.driver

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        kind = "owned" if self.owned else ("imported" if self.imported else "shared")
        return f"<mrkit.MemoryPool {kind} handle={self.handle:#x} device={self.device}>"


class DeviceMemoryResource(Closing, MemoryResource):
    """Stream-ordered device memory from a driver pool (``cuMemAllocFromPoolAsync`` /
    ``cuMemFreeAsync``): the default current resource of every device that supports pools.

    ``DeviceMemoryResource(0)`` uses the device's current pool (shared with the process; mrkit does
    not change it). ``DeviceMemoryResource(0, DeviceMemoryResourceOptions(...))`` creates and owns a
    pool configured by the options; ``DeviceMemoryResource(0, pool=p)`` uses a given
    :class:`MemoryPool`. Two resources are equal when they use the same pool. :meth:`close` (or the
    end of a ``with`` block) destroys a pool the resource created, and leaves any other alone.
    """

    __slots__ = ("driver", "device_id", "pool", "_h", "_alloc", "_free", "_live")
    device_accessible = True
    host_accessible = False
    max_alignment = 256

    def __init__(self, device: int = 0, options: DeviceMemoryResourceOptions | None = None, *,
                 pool: MemoryPool | None = None, driver: Driver | None = None) -> None:
        if options is not None and pool is not None:
            raise ValueError("give options (to create a pool) or pool, not both")
        if options is not None and not isinstance(options, DeviceMemoryResourceOptions):
            raise TypeError(f"options must be DeviceMemoryResourceOptions, not {type(options).__name__}")
        device = check_device(device)
        drv = pool.driver if pool is not None else (driver or get_driver())
        if not drv.device_capability(device, "memory_pools_supported"):
            raise ValueError(f"device {device} does not support memory pools; use CudaMemoryResource")
        if pool is None:
            pool = MemoryPool.create(device, options, driver=drv) if options is not None else \
                MemoryPool.current(device, driver=drv)
        self.driver, self.device_id, self.pool = drv, device, pool
        self._h = pool.handle
        self._alloc = drv.mem_alloc_from_pool_async
        self._free = drv.mem_free_async
        self._live = LiveTable(self)

    def allocate(self, nbytes, stream, alignment=256):
        if type(nbytes) is not int or nbytes <= 0 or alignment is not DEFAULT_ALIGNMENT:
            nbytes = check_request(nbytes, alignment, 256)
            if nbytes == 0:
                return 0
        if type(stream) is not Stream:
            stream = as_stream(stream, self.driver)
        if self.pool._closed:  # a destroyed pool's handle must not reach the driver
            raise closed_resource(self)
        try:
            if stream.uid < 0:  # a default stream is this device's (explicit streams skip the guard)
                with device_scope(self.driver, self.device_id, stream):
                    ptr = self._alloc(nbytes, self._h, stream.handle)
            else:
                ptr = self._alloc(nbytes, self._h, stream._live())  # nor a destroyed stream's
        except (OutOfMemoryError, CUDAError) as exc:
            if not isinstance(exc, OutOfMemoryError) and not (
                    exc.name == "CUDA_ERROR_INVALID_VALUE" and nbytes > self.driver.device_total_mem(self.device_id)):
                raise
            raise OutOfMemoryError(
                f"{self!r} could not allocate {nbytes} bytes ({format_size(nbytes)}) on {stream!r}; "
                f"the pool holds {self.pool.reserved_mem_current} bytes reserved, "
                f"{self.pool.used_mem_current} in use: {exc}", nbytes, self) from None
        self._live.live[ptr] = nbytes
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if type(stream) is not Stream:
            stream = as_stream(stream, self.driver)
        if alignment is not DEFAULT_ALIGNMENT:
            check_request(0, alignment, self.max_alignment)  # every valid alignment is served alike
        live = self._live.live
        if type(nbytes) is not int or type(ptr) is not int or live.get(ptr) != nbytes or ptr == 0:
            if type(ptr) is not int:  # a float equal to a live pointer would find it in the table
                ptr = check_pointer(ptr)
            if ptr == 0 and nbytes == 0 and type(nbytes) is int:
                return
            nbytes = self._live.pop(ptr, nbytes)  # validates (the precise error) and forgets ptr
        else:
            del live[ptr]
        try:
            if stream.uid < 0:
                with device_scope(self.driver, self.device_id, stream):
                    self._free(ptr, stream.handle)
            elif stream.alive is False:
                # the stream is gone (a collected CuPy/PyTorch stream): a free on its handle would reach
                # a destroyed stream; its work may still run, so wait for the device, then free on the
                # default stream
                drv = self.driver
                drv.ctx_synchronize(self.device_id)
                with device_scope(drv, self.device_id, DEFAULT_STREAM):
                    self._free(ptr, DEFAULT_STREAM.handle)
            else:
                self._free(ptr, stream.handle)
        except BaseException:
            live[ptr] = nbytes
            raise

    @property
    def live_bytes(self) -> int:
        return sum(self._live.live.values())

    def outstanding(self) -> dict[int, int]:
        """``{ptr: nbytes}`` of the allocations handed out and not yet returned."""
        return dict(self._live.live)

    def trim(self) -> None:
        """Synchronise the device and give every unused byte of the pool back (owned pools only)."""
        self.driver.ctx_synchronize(self.device_id)
        self.pool.trim_to(0)

    def close(self) -> None:
        """Destroy the pool if this resource created it (:meth:`MemoryPool.close`); ``ValueError``,
        nothing changed, while allocations it handed out are live."""
        pool = self.pool
        if pool.owned and not pool._closed and self._live.live:
            raise still_live(self, len(self._live.live))
        pool.close()

    def __eq__(self, other):
        return isinstance(other, DeviceMemoryResource) and other.pool == self.pool

    def __hash__(self):
        return hash(self.pool)

    def _describe(self) -> str:
        return f"device={self.device_id}, pool={self.pool!r}, driver={self.driver.name}"
