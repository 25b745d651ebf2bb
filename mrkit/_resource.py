"""The ``MemoryResource`` protocol, ``Buffer`` and argument checks."""
from __future__ import annotations

import ctypes
import operator

from ._owned import Owned
from ._stream import DEFAULT_STREAM, Stream, as_stream, order_after
from .driver import Driver, get_driver

__all__ = ["MemoryResource", "Buffer", "check_request", "check_size", "check_device", "check_pointer", "unknown_pointer",
           "size_mismatch", "still_live", "closed_resource", "upstream_chain"]


# The fast paths test ``alignment is not DEFAULT_ALIGNMENT``: an identity test, as cheap as ``!= 256``,
# that also sends ``256.0`` (equal, but not an int) to the checked path. CPython keeps one object for
# the int 256, so every int 256 passes; anything else takes the checked path, which is always right.
DEFAULT_ALIGNMENT = 256


def check_request(nbytes, alignment, max_alignment: int) -> int:
    """Validate an allocation request and return ``nbytes`` as an int.

    Raises ``TypeError``/``ValueError`` naming the argument: ``nbytes`` must be an integer >= 0;
    ``alignment`` a power of two no larger than ``max_alignment``.
    """
    nbytes = check_size(nbytes, "nbytes")
    alignment = _integer(alignment, "alignment")
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    if alignment > max_alignment:
        raise ValueError(f"alignment {alignment} is larger than this resource supports ({max_alignment})")
    return nbytes


def _integer(value, name: str, what: str = "an int", shown: str = "") -> int:
    """``value`` as an int: ``TypeError`` naming the argument for anything but an integer (``4096.0``,
    ``"4096"``, ``None``, ``True``), saying ``name must be <what>, not <type><shown>``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}{shown}")
    return operator.index(value)


def check_size(value, name: str) -> int:
    """``value`` as an int ``>= 0``: ``TypeError`` for anything but an integer (``4096.0``, ``"4096"``,
    ``True``), ``ValueError`` below 0; both name the argument."""
    value = _integer(value, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_pointer(ptr) -> int:
    """``ptr`` as an int, for the error a free of an unknown pointer raises: ``TypeError`` naming the
    argument for anything but an integer (``"0x1000"``, ``4096.0``, ``None``, ``True``). Called where
    the free was already refused, so the fast paths pay nothing for it."""
    return _integer(ptr, "ptr")


def unknown_pointer(ptr, owner) -> ValueError:
    """The error for a free of ``ptr`` that ``owner`` does not hold (never allocated there, or freed
    already); raises ``TypeError`` instead when ``ptr`` is not an integer (:func:`check_pointer`)."""
    return ValueError(f"ptr {check_pointer(ptr):#x} was not allocated by {owner!r} or was already freed")


def still_live(owner, n: int) -> ValueError:
    """The error of ``owner.close()`` while ``n`` of its allocations are live (nothing is changed)."""
    return ValueError(f"{owner!r} still has {n} live allocation{'' if n == 1 else 's'}; free them before close()")


def closed_resource(owner) -> ValueError:
    """The error of an allocation from ``owner`` after its ``close()`` (frees of what it handed out
    before are still taken where the memory allows it)."""
    return ValueError(f"{owner!r} is closed: it hands out no more memory")


def size_mismatch(nbytes, size, ptr) -> ValueError:
    """The error for a free of ``ptr`` whose ``nbytes`` is not the ``size`` it was allocated with."""
    return ValueError(f"nbytes {nbytes} does not match the allocation of {size} bytes at {ptr:#x}")


def check_device(device, name: str = "device") -> int:
    """A device ordinal as an int: ``TypeError`` for anything but an integer (``"0"``, ``0.0``,
    ``True``), ``ValueError`` below 0; both name the argument. Whether the device exists is the
    driver's to say."""
    device = _integer(device, name, "an int (a device ordinal)", f" {device!r}")
    if device < 0:
        raise ValueError(f"{name} must be a device ordinal >= 0, got {device}")
    return device


def upstream_chain(mr) -> list:
    """``mr`` and the resources below it, following ``upstream`` (adaptors, pools) to the bottom."""
    chain, seen = [mr], {id(mr)}
    while hasattr(mr, "upstream"):
        mr = mr.upstream
        if id(mr) in seen:
            break
        seen.add(id(mr))
        chain.append(mr)
    return chain


class UpstreamAccess:
    """Mixin of adaptors and caching resources: memory is accessible where the upstream's is."""

    __slots__ = ()

    @property
    def device_accessible(self) -> bool:
        return self.upstream.device_accessible

    @property
    def host_accessible(self) -> bool:
        return self.upstream.host_accessible


class MemoryResource(Owned):
    """Base class of every mrkit resource and adaptor.

    The protocol is stream-ordered:

    * ``allocate(nbytes, stream, alignment=256) -> int`` returns a pointer usable by work on
      ``stream`` (and by any work ordered after it); ``allocate(0, ...)`` returns 0.
    * ``deallocate(ptr, nbytes, stream, alignment=256)`` returns the block; work enqueued on
      ``stream`` before the call may still use it. ``nbytes`` and ``alignment`` must match the
      allocation. ``deallocate(0, 0, ...)`` is a no-op.
    * properties ``device_accessible``, ``host_accessible``, ``device_id`` (``None`` for host-only
      memory) and ``max_alignment``; equality (two resources are equal when memory from one may be
      freed by the other).

    A resource is shared by reference: ``copy.copy`` and ``copy.deepcopy`` return it, and pickling
    raises ``TypeError`` (a subclass that can be rebuilt elsewhere may define ``__reduce__``).
    """

    __slots__ = ("__weakref__",)
    _pickle_advice = ("; build the resource in the other process instead, e.g. with "
                      "mrkit.resource_from_spec('pool(device)') (mrkit.dask sends a spec to each worker)")

    device_accessible: bool = False
    host_accessible: bool = False
    device_id: int | None = None
    max_alignment: int = 256

    def allocate(self, nbytes: int, stream, alignment: int = 256) -> int:  # pragma: no cover
        raise NotImplementedError

    def deallocate(self, ptr: int, nbytes: int, stream, alignment: int = 256) -> None:  # pragma: no cover
        raise NotImplementedError

    def allocate_buffer(self, nbytes: int, stream=DEFAULT_STREAM, alignment: int = 256) -> "Buffer":
        """Allocate and wrap in an owning :class:`Buffer`."""
        s = as_stream(stream)
        return Buffer(self.allocate(nbytes, s, alignment), nbytes, self, s, alignment)

    def _describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._describe()
        return f"{type(self).__name__}({extra})"


def driver_of(mr) -> Driver | None:
    """The driver of ``mr``'s stack: its own ``driver``, else the first one down its ``upstream``
    chain (an adaptor of another library may not forward attributes); ``None`` for host memory."""
    seen = set()
    while isinstance(mr, MemoryResource) and id(mr) not in seen:
        seen.add(id(mr))
        d = getattr(mr, "driver", None)
        if d is not None:
            return d
        try:
            mr = object.__getattribute__(mr, "upstream")
        except AttributeError:
            return None
    return None


class Buffer:
    """Owning memory: ``ptr``, ``size``, the ``resource`` it came from and the ``stream`` it is
    ordered on. ``close(stream=None)`` gives it back (on ``stream`` if given, which must be ordered
    after the buffer's uses); a context manager closes on exit; a garbage-collected buffer is closed
    on its stream. Device-accessible buffers export ``__cuda_array_interface__`` (version 3, with
    its ``stream`` field) and DLPack.
    """

    __slots__ = ("ptr", "size", "resource", "stream", "alignment", "__weakref__")

    def __init__(self, ptr: int, size: int, resource: MemoryResource, stream: Stream, alignment: int = 256):
        self.ptr, self.size, self.resource, self.stream, self.alignment = ptr, size, resource, stream, alignment

    @property
    def closed(self) -> bool:
        return self.resource is None

    def close(self, stream=None) -> None:
        mr = self.resource
        if mr is None:
            return
        s = self.stream if stream is None else as_stream(stream)
        self.resource = None
        mr.deallocate(self.ptr, self.size, s, self.alignment)

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- copies: two buffers never own one block ------------------------------------------
    @classmethod
    def from_bytes(cls, data, resource: MemoryResource, stream=DEFAULT_STREAM, alignment: int = 256) -> "Buffer":
        """A new buffer from ``resource`` holding ``data`` (bytes-like), written on ``stream``."""
        data = memoryview(data).cast("B")
        s = as_stream(stream)
        s._live()  # a closed stream is refused before anything is allocated
        buf = resource.allocate_buffer(len(data), s, alignment)
        try:
            if data.nbytes and resource.device_accessible:
                (driver_of(resource) or get_driver()).copy_from_host(buf.ptr, data, s.handle)
            elif data.nbytes:
                ctypes.memmove(buf.ptr, bytes(data), data.nbytes)
        except BaseException:
            buf.close()
            raise
        return buf

    def tobytes(self, stream=None) -> bytes:
        """The buffer's bytes, read after the work on ``stream`` (default: the buffer's), which is
        synchronised."""
        mr = self._open()
        if not self.size:
            return b""
        if mr.device_accessible:
            return (driver_of(mr) or get_driver()).copy_to_host(self.ptr, self.size, self._usable(stream).handle)
        return ctypes.string_at(self.ptr, self.size)

    def copy(self, stream=None) -> "Buffer":
        """A new buffer of the same size and alignment from the same resource, holding this buffer's
        bytes: allocated and copied on ``stream`` (default: this buffer's), which is first ordered
        after the work on this buffer's stream. ``copy.copy`` and ``copy.deepcopy`` call it. Pickling
        is by value too: the bytes, unpickled into the current resource of the receiving process."""
        mr = self._open()
        own = self._usable(None)
        s = own if stream is None else self._usable(stream)
        new = mr.allocate_buffer(self.size, s, self.alignment)
        try:
            if self.size and mr.device_accessible:
                drv = driver_of(mr) or get_driver()
                if s != own:
                    order_after(drv, mr.device_id or 0, s.handle, own.handle)
                drv.memcpy_async(new.ptr, self.ptr, self.size, s.handle)
            elif self.size:
                ctypes.memmove(new.ptr, self.ptr, self.size)
        except BaseException:
            new.close()
            raise
        return new

    __copy__ = copy

    def __deepcopy__(self, memo) -> "Buffer":
        return self.copy()

    def _usable(self, stream) -> Stream:
        """The stream of a driver call on this buffer: ``stream`` when given (``ValueError`` once it is
        closed), else the buffer's own. Once that one is gone, its work may still be queued: the device
        is synchronised and the legacy default stream stands in for it (the destroyed handle never
        reaches the driver)."""
        if stream is not None:
            s = as_stream(stream)
            s._live()
            return s
        s = self.stream
        if s.alive is False:
            drv = driver_of(self.resource)
            if drv is not None:
                drv.ctx_synchronize(self.resource.device_id or 0)
            return DEFAULT_STREAM
        return s

    def _open(self) -> MemoryResource:
        mr = self.resource
        if mr is None:
            raise ValueError("the buffer is closed")
        return mr

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown or a dead driver: nothing useful to do
            pass

    def __len__(self) -> int:
        return self.size

    @property
    def __cuda_array_interface__(self) -> dict:
        if not self._open().device_accessible:
            raise AttributeError("host-only memory has no __cuda_array_interface__")
        h = self._usable(None).handle
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr or 0, False),
                "strides": None, "version": 3, "stream": 1 if h == 0 else h}

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule viewing the buffer as ``uint8[size]`` (zero-copy). ``stream`` is the
        consumer's stream (CUDA: 1 is the legacy default stream, 2 the per-thread one, -1 asks for
        no synchronisation): work on it is ordered after the work on the buffer's stream."""
        from ._dlpack import dlpack_device, to_dlpack_capsule

        if self.resource is None:
            raise BufferError("the buffer is closed")
        if copy:
            raise BufferError("mrkit buffers export zero-copy only (copy=True is not supported)")
        if dl_device is not None and tuple(dl_device) != dlpack_device(self):
            raise BufferError(f"cannot export to device {dl_device}; the buffer is on {dlpack_device(self)}")
        if stream is not None and stream != -1 and self.resource.device_accessible:
            if isinstance(stream, bool) or not isinstance(stream, int) or stream == 0:
                raise ValueError(f"stream must be a CUDA stream handle int (not 0), got {stream!r}")
            consumer = 0 if stream == 1 else stream
            own = self._usable(None)
            if consumer != own.handle:
                drv = driver_of(self.resource) or get_driver()
                order_after(drv, self.resource.device_id or 0, consumer, own.handle)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return to_dlpack_capsule(self, versioned)

    def __dlpack_device__(self) -> tuple[int, int]:
        from ._dlpack import dlpack_device

        return dlpack_device(self)

    def __repr__(self) -> str:
        state = "closed" if self.resource is None else f"from {self.resource!r}"
        return f"<mrkit.Buffer ptr={self.ptr:#x} size={self.size} {state}>"
