"""The ``Driver`` interface: everything mrkit asks of CUDA, in one place.

Handles (streams, events, pools, VMM allocation handles) and pointers are plain ints. Sizes are
ints. Every method raises :class:`~mrkit.CUDAError` (or :class:`~mrkit.OutOfMemoryError` for a
driver out-of-memory) with the driver's error name. Two backends implement it:
:mod:`mrkit.driver.cuda` (``cuda.bindings.driver``) and :mod:`mrkit.driver.sim` (a deterministic
simulated device).
"""
from __future__ import annotations

import abc
import contextlib
from abc import abstractmethod

__all__ = ["Driver", "DEVICE_CAPABILITIES", "POOL_ATTRIBUTES", "ACCESS_FLAGS", "MANAGED_ADVICE"]

#: Capability names answered by :meth:`Driver.device_capability`.
DEVICE_CAPABILITIES = (
    "memory_pools_supported",
    "virtual_memory_management_supported",
    "managed_memory",
    "concurrent_managed_access",
    "unified_addressing",
    "pageable_memory_access",
    "compute_capability_major",
    "compute_capability_minor",
    "multiprocessor_count",
)

#: Memory-pool attribute names answered by :meth:`Driver.mem_pool_get_attribute`.
POOL_ATTRIBUTES = (
    "reuse_follow_event_dependencies",
    "reuse_allow_opportunistic",
    "reuse_allow_internal_dependencies",
    "release_threshold",
    "reserved_mem_current",
    "reserved_mem_high",
    "used_mem_current",
    "used_mem_high",
)

#: Access flags for pools and VMM mappings.
ACCESS_FLAGS = ("none", "read", "readwrite")
# shareable handle types a VMM allocation can be created exportable as (cuMemCreate's requestedHandleTypes)
VMM_HANDLE_TYPES = ("none", "posix_fd", "win32", "fabric")

#: Advice names for :meth:`Driver.mem_advise`.
MANAGED_ADVICE = (
    "set_read_mostly", "unset_read_mostly",
    "set_preferred_location", "unset_preferred_location",
    "set_accessed_by", "unset_accessed_by",
)


class Driver(abc.ABC):
    """Abstract driver. Subclasses implement every method; ``name`` is ``"cuda"`` or ``"sim"``.

    Location arguments (``location``) are a device ordinal (int >= 0) or ``"host"``.
    """

    name = "abstract"

    # -- versions and devices ------------------------------------------------------------
    @abstractmethod
    def driver_version(self) -> int:
        """cuDriverGetVersion: the driver version as an int (13000 for 13.0)."""
    @abstractmethod
    def device_count(self) -> int:
        """cuDeviceGetCount: the number of devices (0 when none)."""
    @abstractmethod
    def device_name(self, dev: int) -> str:
        """cuDeviceGetName of device ``dev``."""
    @abstractmethod
    def device_total_mem(self, dev: int) -> int:
        """cuDeviceTotalMem: bytes of memory on ``dev``."""
    @abstractmethod
    def device_capability(self, dev: int, name: str) -> int:
        """cuDeviceGetAttribute for one of DEVICE_CAPABILITIES (``ValueError`` for another name)."""
    @abstractmethod
    def mem_get_info(self, dev: int) -> tuple[int, int]:
        """cuMemGetInfo in ``dev``'s context: ``(free, total)`` bytes."""
    @abstractmethod
    def ensure_context(self, dev: int) -> None:
        """Make ``dev``'s primary context current on this thread and leave it so (retained once).
        mrkit itself never calls this: it uses :meth:`on_device`, which restores the caller's."""
    @abstractmethod
    def current_device(self) -> int:
        """The device of this thread's current context (cuCtxGetDevice); 0 when it has none."""
    @abstractmethod
    def on_device(self, dev: int) -> "contextlib.AbstractContextManager[None]":
        """A context manager: ``dev``'s primary context is current inside it (cuCtxSetCurrent only
        when it is not already), and the thread's previous context, or none, is current again on
        exit. Work on a default stream (handle 0) inside it is ``dev``'s default stream."""
    @abstractmethod
    def ctx_synchronize(self, dev: int) -> None:
        """cuCtxSynchronize of ``dev``'s context: all work on every stream of the device has completed."""
    @abstractmethod
    def can_access_peer(self, dev: int, peer: int) -> bool:
        """cuDeviceCanAccessPeer(``dev``, ``peer``)."""

    # -- streams and events --------------------------------------------------------------
    @abstractmethod
    def stream_create(self, dev: int, nonblocking: bool = True, priority: int = 0) -> int:
        """cuStreamCreateWithPriority on ``dev``: a new stream handle."""
    @abstractmethod
    def stream_destroy(self, stream: int) -> None:
        """cuStreamDestroy: the handle becomes invalid (and may be reused); queued work still completes."""
    @abstractmethod
    def stream_synchronize(self, stream: int) -> None:
        """cuStreamSynchronize: the host waits for all work queued on ``stream``."""
    @abstractmethod
    def stream_query(self, stream: int) -> bool:
        """cuStreamQuery: True when all work queued on ``stream`` has completed."""
    @abstractmethod
    def stream_get_id(self, stream: int) -> int:
        """cuStreamGetId: the stream's unique id, never reused (unlike the handle)."""
    @abstractmethod
    def stream_get_device(self, stream: int) -> int:
        """The device ordinal of ``stream`` (cuStreamGetCtx + cuCtxGetDevice)."""
    @abstractmethod
    def stream_wait_event(self, stream: int, event: int) -> None:
        """cuStreamWaitEvent: future work on ``stream`` waits for ``event``'s recorded work."""
    @abstractmethod
    def event_create(self, dev: int) -> int:
        """cuEventCreate (timing disabled) on ``dev``."""
    @abstractmethod
    def event_destroy(self, event: int) -> None:
        """cuEventDestroy."""
    @abstractmethod
    def event_record(self, event: int, stream: int) -> None:
        """cuEventRecord of ``event`` on ``stream``: captures the work queued so far."""
    @abstractmethod
    def event_query(self, event: int) -> bool:
        """cuEventQuery: True when the recorded work has completed."""
    @abstractmethod
    def event_synchronize(self, event: int) -> None:
        """cuEventSynchronize: the host waits for the recorded work."""

    # -- plain allocation ---------------------------------------------------------------
    @abstractmethod
    def mem_alloc(self, dev: int, nbytes: int) -> int:
        """cuMemAlloc on ``dev`` (``OutOfMemoryError`` when the device is full)."""
    @abstractmethod
    def mem_free(self, ptr: int) -> None:
        """cuMemFree (synchronous with respect to the device)."""
    @abstractmethod
    def mem_host_alloc(self, nbytes: int, portable: bool = True, devicemap: bool = True,
                       writecombined: bool = False) -> int:
        """cuMemHostAlloc: page-locked host memory (flags as named)."""
    @abstractmethod
    def mem_free_host(self, ptr: int) -> None:
        """cuMemFreeHost."""
    @abstractmethod
    def mem_alloc_managed(self, dev: int, nbytes: int, attach: str = "global") -> int:
        """cuMemAllocManaged with ``attach`` ``"global"`` or ``"host"``."""
    @abstractmethod
    def mem_advise(self, ptr: int, nbytes: int, advice: str, location) -> None:
        """cuMemAdvise of one of MANAGED_ADVICE for ``location`` (a device ordinal or ``"host"``)."""
    @abstractmethod
    def mem_prefetch_async(self, ptr: int, nbytes: int, location, stream: int) -> None:
        """cuMemPrefetchAsync of managed memory to ``location`` on ``stream``."""
    @abstractmethod
    def pointer_info(self, ptr: int) -> dict:
        """cuPointerGetAttributes: a dict with the memory type, device and range of ``ptr``."""

    # -- data movement (used by tests, the testing kit and Buffer helpers) ----------------
    @abstractmethod
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """cuMemsetD8Async of ``nbytes`` at ``ptr`` on ``stream``."""
    @abstractmethod
    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """cuMemcpyAsync of ``nbytes`` from ``src`` to ``dst`` on ``stream``."""
    @abstractmethod
    def copy_to_host(self, ptr: int, nbytes: int, stream: int) -> bytes:
        """``nbytes`` at ``ptr`` copied to the host, ordered on ``stream`` (which is then synchronised)."""
    @abstractmethod
    def copy_from_host(self, ptr: int, data: bytes, stream: int) -> None:
        """``data`` copied to ``ptr``, ordered on ``stream``."""
    @abstractmethod
    def touch(self, ptr: int, nbytes: int, stream: int, write: bool = True) -> None:
        """Stand-in for a kernel that reads (``write=False``) or writes ``nbytes`` at ``ptr`` on
        ``stream``. The cuda backend writes zeros (or reads into a scratch buffer)."""

    # -- stream-ordered allocator ---------------------------------------------------------
    @abstractmethod
    def device_get_default_mem_pool(self, dev: int) -> int:
        """cuDeviceGetDefaultMemPool of ``dev``."""
    @abstractmethod
    def device_get_mem_pool(self, dev: int) -> int:
        """cuDeviceGetMemPool: the current pool of ``dev``."""
    @abstractmethod
    def mem_pool_create(self, dev: int, max_size: int = 0, ipc_handle_type: str = "none") -> int:
        """cuMemPoolCreate on ``dev`` (``max_size`` 0: unbounded; ``ipc_handle_type`` for export)."""
    @abstractmethod
    def mem_pool_destroy(self, pool: int) -> None:
        """cuMemPoolDestroy."""
    @abstractmethod
    def mem_pool_get_attribute(self, pool: int, name: str) -> int:
        """cuMemPoolGetAttribute of one of POOL_ATTRIBUTES."""
    @abstractmethod
    def mem_pool_set_attribute(self, pool: int, name: str, value: int) -> None:
        """cuMemPoolSetAttribute of one of POOL_ATTRIBUTES."""
    @abstractmethod
    def mem_pool_trim_to(self, pool: int, min_bytes_to_keep: int) -> None:
        """cuMemPoolTrimTo: release unused memory above ``min_bytes_to_keep``."""
    @abstractmethod
    def mem_pool_set_access(self, pool: int, dev: int, flags: str) -> None:
        """cuMemPoolSetAccess for device ``dev`` with one of ACCESS_FLAGS."""
    @abstractmethod
    def mem_pool_get_access(self, pool: int, dev: int) -> str:
        """cuMemPoolGetAccess: the access flag of device ``dev``."""
    @abstractmethod
    def mem_alloc_from_pool_async(self, nbytes: int, pool: int, stream: int) -> int:
        """cuMemAllocFromPoolAsync: ``nbytes`` from ``pool``, usable by work ordered after it on ``stream``."""
    @abstractmethod
    def mem_free_async(self, ptr: int, stream: int) -> None:
        """cuMemFreeAsync: ``ptr`` returns to its pool once the work queued on ``stream`` before it has run."""
    @abstractmethod
    def mem_pool_export_to_shareable_handle(self, pool: int) -> int:
        """cuMemPoolExportToShareableHandle (a POSIX file descriptor)."""
    @abstractmethod
    def mem_pool_import_from_shareable_handle(self, handle: int) -> int:
        """cuMemPoolImportFromShareableHandle."""
    @abstractmethod
    def mem_pool_export_pointer(self, ptr: int) -> bytes:
        """cuMemPoolExportPointer: the opaque export data of ``ptr``."""
    @abstractmethod
    def mem_pool_import_pointer(self, pool: int, data: bytes) -> int:
        """cuMemPoolImportPointer into an imported ``pool``."""

    # -- virtual memory management --------------------------------------------------------
    @abstractmethod
    def mem_get_allocation_granularity(self, dev: int, recommended: bool = False,
                                       handle_type: str = "none") -> int:
        """cuMemGetAllocationGranularity (minimum, or recommended) for ``handle_type``."""
    @abstractmethod
    def mem_create(self, dev: int, nbytes: int, handle_type: str = "none") -> int:
        """cuMemCreate: a physical allocation of ``nbytes`` (a multiple of the granularity) on ``dev``."""
    @abstractmethod
    def mem_release(self, handle: int) -> None:
        """cuMemRelease of a physical allocation handle (freed once unmapped everywhere)."""
    @abstractmethod
    def mem_address_reserve(self, nbytes: int, alignment: int = 0) -> int:
        """cuMemAddressReserve: a virtual range of ``nbytes``."""
    @abstractmethod
    def mem_address_free(self, ptr: int, nbytes: int) -> None:
        """cuMemAddressFree: ``nbytes`` must equal the reservation's size."""
    @abstractmethod
    def mem_map(self, ptr: int, nbytes: int, offset: int, handle: int) -> None:
        """cuMemMap of ``handle`` at ``offset`` into ``[ptr, ptr + nbytes)``."""
    @abstractmethod
    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        """cuMemUnmap of a whole mapping (a sub-range is CUDA_ERROR_INVALID_VALUE); not stream ordered."""
    @abstractmethod
    def mem_set_access(self, ptr: int, nbytes: int, dev: int, flags: str = "readwrite") -> None:
        """cuMemSetAccess of ``[ptr, ptr + nbytes)`` for device ``dev``."""

    def __repr__(self) -> str:
        return f"<mrkit {self.name} driver>"
