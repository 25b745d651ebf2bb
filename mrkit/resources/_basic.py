"""Upstream resources without a driver pool: cuMemAlloc, pageable host, pinned host, managed."""
from __future__ import annotations

import numpy as np

from .._errors import CUDAError, OutOfMemoryError
from .._resource import (DEFAULT_ALIGNMENT, MemoryResource, check_device, check_pointer, check_request, size_mismatch,
                         unknown_pointer)
from .._sizes import format_size
from .._stream import Stream, as_stream, check_stream
from ..driver import Driver, get_driver
from ._common import LiveTable

__all__ = ["CudaMemoryResource", "HostMemoryResource", "PinnedMemoryResource", "ManagedMemoryResource"]


def _impossible(mr) -> int:
    """A size no allocation of ``mr`` can reach: the device's memory, or the host's address space."""
    if mr.device_id is not None:
        return mr.driver.device_total_mem(mr.device_id)
    return 1 << 47


def _oom(exc: Exception, nbytes: int, mr) -> OutOfMemoryError:
    return OutOfMemoryError(f"{mr!r} could not allocate {nbytes} bytes ({format_size(nbytes)}): {exc}",
                            nbytes, mr)


class _DriverResource(MemoryResource):
    """Shared code of resources that make one driver allocation per request."""

    __slots__ = ("driver", "device_id", "_live")

    def __init__(self, device: int | None, driver: Driver | None) -> None:
        if device is not None:
            device = check_device(device)
        self.driver = driver or get_driver()
        self.device_id = device
        self._live = LiveTable(self)

    def _raw_alloc(self, nbytes: int) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _raw_free(self, ptr: int, stream: Stream) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def allocate(self, nbytes, stream, alignment=256):
        nbytes = check_request(nbytes, alignment, self.max_alignment)
        if type(stream) is not Stream:
            stream = as_stream(stream, self.driver)
        if nbytes == 0:
            return 0
        try:
            ptr = self._raw_alloc(nbytes)
        except OutOfMemoryError as exc:
            raise _oom(exc, nbytes, self) from None
        except CUDAError as exc:
            # Some drivers answer INVALID_VALUE rather than OUT_OF_MEMORY for sizes beyond any
            # device: report what the user needs to know, that the request cannot be served.
            if exc.name == "CUDA_ERROR_INVALID_VALUE" and nbytes > _impossible(self):
                raise _oom(exc, nbytes, self) from None
            raise
        self._live.live[ptr] = nbytes
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if type(stream) is not Stream:
            stream = as_stream(stream, self.driver)
        if alignment is not DEFAULT_ALIGNMENT:
            check_request(0, alignment, self.max_alignment)  # every valid alignment is served alike
        if type(ptr) is not int:  # a float equal to a live pointer would find it in the table
            ptr = check_pointer(ptr)
        if ptr == 0 and nbytes == 0 and type(nbytes) is int:
            return
        nbytes = self._live.pop(ptr, nbytes)
        try:
            self._raw_free(ptr, stream)
        except BaseException:
            self._live.restore(ptr, nbytes)
            raise

    @property
    def live_bytes(self) -> int:
        """Bytes handed out and not yet returned."""
        return sum(self._live.live.values())

    def outstanding(self) -> dict[int, int]:
        """``{ptr: nbytes}`` of the allocations handed out and not yet returned."""
        return dict(self._live.live)

    def __eq__(self, other):
        return (type(other) is type(self) and other.driver is self.driver
                and other.device_id == self.device_id)

    def __hash__(self):
        return hash((type(self), id(self.driver), self.device_id))

    def _describe(self) -> str:
        return f"device={self.device_id}, driver={self.driver.name}"


class CudaMemoryResource(_DriverResource):
    """``cuMemAlloc``/``cuMemFree``: one driver call per request. ``deallocate`` is not stream
    ordered: ``cuMemFree`` waits for outstanding device work first."""

    __slots__ = ()
    device_accessible = True

    def __init__(self, device: int = 0, *, driver: Driver | None = None) -> None:
        super().__init__(device, driver)
        self.driver.device_name(device)  # validates the ordinal (CUDAError on a bad one)

    def _raw_alloc(self, nbytes):
        return self.driver.mem_alloc(self.device_id, nbytes)

    def _raw_free(self, ptr, stream):
        self.driver.mem_free(ptr)


class PinnedMemoryResource(_DriverResource):
    """Page-locked host memory (``cuMemHostAlloc``), device-accessible through unified addressing.

    Flags: ``portable`` (usable from every context), ``devicemap`` (mapped into the device address
    space) and ``writecombined`` (fast host writes and device reads over PCIe, slow host reads).
    Deallocation synchronises ``stream`` before ``cuMemFreeHost`` (the device, when ``stream`` is closed
    or its CuPy/PyTorch owner collected). Pinned allocation is slow (it
    pins pages in the OS); put a :class:`~mrkit.PoolResource` on top for frequent
    allocations: ``PoolResource(PinnedMemoryResource())``.
    """

    __slots__ = ("portable", "devicemap", "writecombined")
    host_accessible = True
    device_accessible = True

    def __init__(self, *, portable: bool = True, devicemap: bool = True, writecombined: bool = False,
                 driver: Driver | None = None) -> None:
        super().__init__(None, driver)
        self.portable, self.devicemap, self.writecombined = bool(portable), bool(devicemap), bool(writecombined)

    def _raw_alloc(self, nbytes):
        return self.driver.mem_host_alloc(nbytes, self.portable, self.devicemap, self.writecombined)

    def _raw_free(self, ptr, stream):
        if stream.alive is False:  # closed, or a collected CuPy/PyTorch stream: its work may still run
            self.driver.ctx_synchronize(stream.device or 0)
        else:
            self.driver.stream_synchronize(stream.handle)
        self.driver.mem_free_host(ptr)

    def __eq__(self, other):
        return super().__eq__(other) and (other.portable, other.devicemap, other.writecombined) == (
            self.portable, self.devicemap, self.writecombined)

    def __hash__(self):
        return super().__hash__()

    def _describe(self) -> str:
        return (f"portable={self.portable}, devicemap={self.devicemap}, "
                f"writecombined={self.writecombined}, driver={self.driver.name}")


class ManagedMemoryResource(_DriverResource):
    """Managed (unified) memory from ``cuMemAllocManaged``; host- and device-accessible.

    ``attach`` is ``"global"`` (any stream on any device may access) or ``"host"``.
    :meth:`advise` and :meth:`prefetch` wrap ``cuMemAdvise``/``cuMemPrefetchAsync`` on both
    cuda-bindings 12.x and 13.x; a location is a device ordinal or ``"host"``.
    """

    __slots__ = ("attach",)
    host_accessible = True
    device_accessible = True

    def __init__(self, device: int = 0, *, attach: str = "global", driver: Driver | None = None) -> None:
        if attach not in ("global", "host"):
            raise ValueError(f"unsupported attach: {attach!r} (expected 'global' or 'host')")
        super().__init__(device, driver)
        if not self.driver.device_capability(device, "managed_memory"):
            raise ValueError(f"device {device} does not support managed memory")
        self.attach = attach

    def _raw_alloc(self, nbytes):
        return self.driver.mem_alloc_managed(self.device_id, nbytes, self.attach)

    def _raw_free(self, ptr, stream):
        self.driver.mem_free(ptr)

    def advise(self, ptr: int, nbytes: int, advice: str, location) -> None:
        """``cuMemAdvise`` on ``[ptr, ptr+nbytes)``; advice names: ``set_read_mostly``,
        ``set_preferred_location``, ``set_accessed_by`` and their ``unset_`` forms."""
        self.driver.mem_advise(ptr, nbytes, advice, location)

    def prefetch(self, ptr: int, nbytes: int, location, stream) -> None:
        """``cuMemPrefetchAsync`` of ``[ptr, ptr+nbytes)`` to ``location`` on ``stream``."""
        self.driver.mem_prefetch_async(ptr, nbytes, location, as_stream(stream, self.driver)._live())

    def __eq__(self, other):
        return super().__eq__(other) and other.attach == self.attach

    def __hash__(self):
        return super().__hash__()


class HostMemoryResource(MemoryResource):
    """Pageable host memory (numpy-backed); works with no GPU and no driver at all. Not stream
    ordered: the stream is validated and otherwise ignored. ``max_alignment`` is 4096."""

    __slots__ = ("_arrays",)
    host_accessible = True
    device_accessible = False
    device_id = None
    max_alignment = 4096

    def __init__(self) -> None:
        self._arrays: dict[int, tuple[np.ndarray, int]] = {}

    def allocate(self, nbytes, stream, alignment=256):
        nbytes = check_request(nbytes, alignment, self.max_alignment)
        check_stream(stream)
        if nbytes == 0:
            return 0
        alignment = max(alignment, 256)
        try:
            arr = np.empty(nbytes + alignment, dtype=np.uint8)
        except (MemoryError, ValueError):  # numpy: "Maximum allowed dimension exceeded" past 2**63
            raise OutOfMemoryError(f"{self!r} could not allocate {nbytes} bytes ({format_size(nbytes)}) "
                                   "of host memory", nbytes, self) from None
        base = arr.ctypes.data
        ptr = base + (-base % alignment)
        self._arrays[ptr] = (arr, nbytes)
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        check_stream(stream)
        if type(nbytes) is not int or alignment is not DEFAULT_ALIGNMENT:
            nbytes = check_request(nbytes, alignment, self.max_alignment)
        if type(ptr) is not int:  # a float equal to a live pointer would find it in the table
            ptr = check_pointer(ptr)
        if ptr == 0 and nbytes == 0:
            return
        entry = self._arrays.get(ptr)
        if entry is None:
            raise unknown_pointer(ptr, self)
        if entry[1] != nbytes:
            raise size_mismatch(nbytes, entry[1], ptr)
        del self._arrays[ptr]

    @property
    def live_bytes(self) -> int:
        return sum(n for _, n in self._arrays.values())

    def view(self, ptr: int, nbytes: int) -> memoryview:
        """A writable memoryview of ``nbytes`` of a live allocation starting at ``ptr``."""
        for start, (arr, size) in list(self._arrays.items()):  # a snapshot: other threads allocate
            if start <= ptr and ptr + nbytes <= start + size:
                off = ptr - arr.ctypes.data
                return memoryview(arr[off:off + nbytes])
        raise ValueError(f"[{ptr:#x}, +{nbytes}) is not inside a live allocation of {self!r}")

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return id(self)
