"""The current resource of each device: ``get_current_resource``, ``set_current_resource``, ``using``.

Sits above the resources, adaptors and the spec builder (it builds the default resource and reads
``MRKIT_RESOURCE``), so nothing below it needs a lazy import."""
from __future__ import annotations

import copyreg
import os
import threading
from contextlib import contextmanager

from ._resource import Buffer, MemoryResource
from ._stream import DEFAULT_STREAM
from ._spec import SpecError, build_resource, parse_spec, spec_devices
from .driver import get_driver
from .resources import CudaMemoryResource, DeviceMemoryResource

__all__ = ["get_current_resource", "set_current_resource", "using", "set_resource_factory",
           "get_current_device_resource", "set_current_device_resource", "env_spec"]

# -- per-device current resource ---------------------------------------------------------------
_current: dict[int, MemoryResource] = {}
_current_lock = threading.RLock()  # a factory may itself ask for another device's resource
_factory = None  # callable(device) -> MemoryResource for devices with no resource set
_listeners: list = []  # callables(device) told when a device's current resource changes


def _changed(dev: int) -> None:
    for fn in list(_listeners):
        if fn(dev) is False:  # a listener whose owner is gone
            try:
                _listeners.remove(fn)
            except ValueError:  # pragma: no cover - removed by another thread meanwhile
                pass


def on_change(fn) -> None:
    """Call ``fn(device)`` whenever the current resource of ``device`` is replaced (allocators that
    follow the current resource drop what they bound to the old one; its live blocks still go home)."""
    _listeners.append(fn)


def _device_of(device) -> int:
    if device is None:
        return get_driver().current_device()
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device must be a device ordinal >= 0, got {device!r}")
    return device


def env_spec(device_count: int | None = None):
    """The parsed ``MRKIT_RESOURCE`` spec, or None when unset; a bad spec raises ``ValueError``
    naming the variable, the position and the reason. With ``device_count``, a spec naming a device
    the machine lacks is refused too."""
    spec = os.environ.get("MRKIT_RESOURCE")
    if not spec:
        return None
    try:
        node = parse_spec(spec)
    except ValueError as exc:
        raise SpecError(f"MRKIT_RESOURCE={spec!r} is not a valid resource spec: {exc}") from None
    if device_count is not None:
        missing = sorted(d for d in spec_devices(node) if d >= device_count)
        if missing:
            raise SpecError(f"MRKIT_RESOURCE={spec!r} names device {missing[0]}, but this machine has "
                            f"{device_count} device{'s' if device_count != 1 else ''}")
    return node


def _default_resource(device: int) -> MemoryResource:
    drv = get_driver()
    if _factory is not None:
        mr = _factory(device)
        if not isinstance(mr, MemoryResource):
            raise TypeError(f"the resource factory returned {type(mr).__name__} for device {device}, "
                            "not a MemoryResource")
        return mr
    node = env_spec(drv.device_count())
    # MRKIT_RESOURCE applies to every device unless it names devices explicitly (then to those only);
    # each device gets its own resources and its own log file.
    if node is not None and (not spec_devices(node) or spec_devices(node) == {device}):
        return build_resource(node, drv, device)
    if drv.device_capability(device, "memory_pools_supported"):
        return DeviceMemoryResource(device, driver=drv)
    return CudaMemoryResource(device, driver=drv)


def get_current_resource(device: int | None = None) -> MemoryResource:
    """The current resource of ``device`` (by default the device current on this thread, as CuPy,
    PyTorch and RMM pick it). Unless set, it is built from ``MRKIT_RESOURCE`` or is a
    :class:`~mrkit.resources.DeviceMemoryResource` on the device's default pool (or a
    :class:`~mrkit.resources.CudaMemoryResource` where pools are unsupported)."""
    dev = _device_of(device)
    mr = _current.get(dev)
    if mr is None:
        with _current_lock:
            mr = _current.get(dev)
            if mr is None:
                mr = _current[dev] = _default_resource(dev)
    return mr


def set_current_resource(mr: MemoryResource, device: int | None = None) -> MemoryResource | None:
    """Make ``mr`` the current resource of ``device`` (default: ``mr.device_id``, else the current
    device); returns the previous one."""
    if not isinstance(mr, MemoryResource):
        raise TypeError(f"mr must be a MemoryResource, not {type(mr).__name__}")
    dev = _device_of(device if device is not None else mr.device_id)
    with _current_lock:
        old = _current.get(dev)
        _current[dev] = mr
    if old is not mr:
        _changed(dev)
    return old


def get_current_device_resource(device: int | None = None) -> MemoryResource:
    """RMM's name for :func:`get_current_resource`."""
    return get_current_resource(device)


def set_current_device_resource(mr: MemoryResource, device: int | None = None) -> MemoryResource | None:
    """RMM's name for :func:`set_current_resource` (returns the previous resource)."""
    return set_current_resource(mr, device)


def set_resource_factory(factory) -> None:
    """Build each device's current resource lazily, on first use, with ``factory(device)`` (``None``:
    back to ``MRKIT_RESOURCE`` or the driver's pool). Resources already current stay until replaced:
    :func:`mrkit.reinitialize` replaces them."""
    global _factory
    if factory is not None and not callable(factory):
        raise TypeError(f"factory must be a callable(device) -> MemoryResource, not {type(factory).__name__}")
    with _current_lock:
        _factory = factory


@contextmanager
def using(mr: MemoryResource, device: int | None = None):
    """``with mrkit.using(mr):`` — ``mr`` is the current resource of its device inside the block."""
    dev = _device_of(device if device is not None else mr.device_id)
    old = set_current_resource(mr, dev)
    try:
        yield mr
    finally:
        with _current_lock:
            if old is None:
                _current.pop(dev, None)
            else:
                _current[dev] = old
        _changed(dev)


def rebuild_all(factory) -> None:
    """Drop every device's current resource and build each again on first use with
    ``factory(device)`` (``None``: the defaults)."""
    with _current_lock:
        set_resource_factory(factory)  # checks it first: a bad factory changes nothing
        devices = list(_current)
        _current.clear()
    for dev in devices:
        _changed(dev)


def _reset_current_resources() -> None:
    rebuild_all(None)


# -- a Buffer pickles by value (as rmm.DeviceBuffer does): its bytes, unpickled into the current
# resource of the receiving process on the default stream. Registered here, above the resources.
def _buffer_from_bytes(data: bytes, alignment: int) -> Buffer:
    return Buffer.from_bytes(data, get_current_resource(), DEFAULT_STREAM, alignment)


def _reduce_buffer(buf: Buffer):
    return _buffer_from_bytes, (buf.tobytes(), buf.alignment)


copyreg.pickle(Buffer, _reduce_buffer)
