"""The ``Driver`` interface: everything mrkit asks of CUDA, in one place.

Handles (streams, events, pools, VMM allocation handles) and pointers are plain ints. Sizes are
ints. Every method raises :class:`~mrkit.CUDAError` (or :class:`~mrkit.OutOfMemoryError` for a
driver out-of-memory) with the driver's error name. Two backends implement it:
:mod:`mrkit.driver.cuda` (``cuda.bindings.driver``) and :mod:`mrkit.driver.sim` (a deterministic
simulated device).
"""
from __future__ import annotations

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


class Driver:
    """Abstract driver. Subclasses implement every method; ``name`` is ``"cuda"`` or ``"sim"``.

    Location arguments (``location``) are a device ordinal (int >= 0) or ``"host"``.
    """

    name = "abstract"

    # -- versions and devices ------------------------------------------------------------
    def driver_version(self) -> int: raise NotImplementedError
    def device_count(self) -> int: raise NotImplementedError
    def device_name(self, dev: int) -> str: raise NotImplementedError
    def device_total_mem(self, dev: int) -> int: raise NotImplementedError
    def device_capability(self, dev: int, name: str) -> int: raise NotImplementedError
    def mem_get_info(self, dev: int) -> tuple[int, int]: raise NotImplementedError
    def ensure_context(self, dev: int) -> None: raise NotImplementedError
    def ctx_synchronize(self, dev: int) -> None: raise NotImplementedError
    def can_access_peer(self, dev: int, peer: int) -> bool: raise NotImplementedError

    # -- streams and events --------------------------------------------------------------
    def stream_create(self, dev: int, nonblocking: bool = True, priority: int = 0) -> int: raise NotImplementedError
    def stream_destroy(self, stream: int) -> None: raise NotImplementedError
    def stream_synchronize(self, stream: int) -> None: raise NotImplementedError
    def stream_query(self, stream: int) -> bool: raise NotImplementedError
    def stream_get_id(self, stream: int) -> int: raise NotImplementedError
    def stream_get_device(self, stream: int) -> int: raise NotImplementedError
    def stream_wait_event(self, stream: int, event: int) -> None: raise NotImplementedError
    def event_create(self, dev: int) -> int: raise NotImplementedError
    def event_destroy(self, event: int) -> None: raise NotImplementedError
    def event_record(self, event: int, stream: int) -> None: raise NotImplementedError
    def event_query(self, event: int) -> bool: raise NotImplementedError
    def event_synchronize(self, event: int) -> None: raise NotImplementedError

    # -- plain allocation ---------------------------------------------------------------
    def mem_alloc(self, dev: int, nbytes: int) -> int: raise NotImplementedError
    def mem_free(self, ptr: int) -> None: raise NotImplementedError
    def mem_host_alloc(self, nbytes: int, portable: bool = True, devicemap: bool = True,
                       writecombined: bool = False) -> int: raise NotImplementedError
    def mem_free_host(self, ptr: int) -> None: raise NotImplementedError
    def mem_alloc_managed(self, dev: int, nbytes: int, attach: str = "global") -> int: raise NotImplementedError
    def mem_advise(self, ptr: int, nbytes: int, advice: str, location) -> None: raise NotImplementedError
    def mem_prefetch_async(self, ptr: int, nbytes: int, location, stream: int) -> None: raise NotImplementedError
    def pointer_info(self, ptr: int) -> dict: raise NotImplementedError

    # -- data movement (used by tests, the testing kit and Buffer helpers) ----------------
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None: raise NotImplementedError
    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None: raise NotImplementedError
    def copy_to_host(self, ptr: int, nbytes: int, stream: int) -> bytes: raise NotImplementedError
    def copy_from_host(self, ptr: int, data: bytes, stream: int) -> None: raise NotImplementedError
    def touch(self, ptr: int, nbytes: int, stream: int, write: bool = True) -> None:
        """Stand-in for a kernel that reads (``write=False``) or writes ``nbytes`` at ``ptr`` on
        ``stream``. The cuda backend writes zeros (or reads into a scratch buffer)."""
        raise NotImplementedError

    # -- stream-ordered allocator ---------------------------------------------------------
    def device_get_default_mem_pool(self, dev: int) -> int: raise NotImplementedError
    def device_get_mem_pool(self, dev: int) -> int: raise NotImplementedError
    def mem_pool_create(self, dev: int, max_size: int = 0, ipc_handle_type: str = "none") -> int: raise NotImplementedError
    def mem_pool_destroy(self, pool: int) -> None: raise NotImplementedError
    def mem_pool_get_attribute(self, pool: int, name: str) -> int: raise NotImplementedError
    def mem_pool_set_attribute(self, pool: int, name: str, value: int) -> None: raise NotImplementedError
    def mem_pool_trim_to(self, pool: int, min_bytes_to_keep: int) -> None: raise NotImplementedError
    def mem_pool_set_access(self, pool: int, dev: int, flags: str) -> None: raise NotImplementedError
    def mem_pool_get_access(self, pool: int, dev: int) -> str: raise NotImplementedError
    def mem_alloc_from_pool_async(self, nbytes: int, pool: int, stream: int) -> int: raise NotImplementedError
    def mem_free_async(self, ptr: int, stream: int) -> None: raise NotImplementedError
    def mem_pool_export_to_shareable_handle(self, pool: int) -> int: raise NotImplementedError
    def mem_pool_import_from_shareable_handle(self, handle: int) -> int: raise NotImplementedError
    def mem_pool_export_pointer(self, ptr: int) -> bytes: raise NotImplementedError
    def mem_pool_import_pointer(self, pool: int, data: bytes) -> int: raise NotImplementedError

    # -- virtual memory management --------------------------------------------------------
    def mem_get_allocation_granularity(self, dev: int, recommended: bool = False,
                                       handle_type: str = "none") -> int: raise NotImplementedError
    def mem_create(self, dev: int, nbytes: int, handle_type: str = "none") -> int: raise NotImplementedError
    def mem_release(self, handle: int) -> None: raise NotImplementedError
    def mem_address_reserve(self, nbytes: int, alignment: int = 0) -> int: raise NotImplementedError
    def mem_address_free(self, ptr: int, nbytes: int) -> None: raise NotImplementedError
    def mem_map(self, ptr: int, nbytes: int, offset: int, handle: int) -> None: raise NotImplementedError
    def mem_unmap(self, ptr: int, nbytes: int) -> None: raise NotImplementedError
    def mem_set_access(self, ptr: int, nbytes: int, dev: int, flags: str = "readwrite") -> None: raise NotImplementedError

    def __repr__(self) -> str:
        return f"<mrkit {self.name} driver>"
