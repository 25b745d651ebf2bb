"""``mrkit.reinitialize``: every device's current resource set up in one call, in the spirit of
``rmm.reinitialize`` (and what the Dask worker plugin calls on each worker).

Sits above the current-resource registry, the resources, the adaptors and the spec builder."""
from __future__ import annotations

import os
from pathlib import Path

from . import _current
from ._resource import MemoryResource
from ._sizes import parse_size
from ._spec import Node, _device_path, build_resource, parse_spec
from .adaptors import LoggingAdaptor, StatisticsAdaptor, TrackingAdaptor
from .driver import get_driver

__all__ = ["reinitialize", "check_arguments", "KINDS"]

KINDS = ("pool", "device", "vmm", "managed", "cuda")
"""Resource kinds :func:`reinitialize` knows by name (besides a spec string or a factory)."""

_owned_logs: list[LoggingAdaptor] = []  # logs the last reinitialize opened; the next one closes them


def _fraction_or_size(value, name: str, total: int | None) -> int | None:
    """Bytes from an int, a size string or a float fraction (0, 1] of the device's memory (``total``;
    ``None``: only check, a fraction then gives ``None``)."""
    if value is None:
        return None
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name} as a fraction of device memory must be in (0, 1], got {value}")
        return None if total is None else int(total * value) & -256
    return parse_size(value, name)


def check_arguments(resource=None, *, devices=None, initial_pool_size=None, maximum_pool_size=None,
                    release_threshold=None, log_file=None, statistics: bool = False, tracking: bool = False,
                    cupy: bool = False, numba: bool = False):
    """Every check of :func:`reinitialize`'s arguments that needs no driver (so a Dask client can make
    them before sending them to its workers); returns ``(devices as a list or None, make)`` where
    ``make`` is the parsed spec, the kind, or the factory."""
    for name, flag in (("statistics", statistics), ("tracking", tracking), ("cupy", cupy), ("numba", numba)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, not {flag!r}")
    if devices is not None:
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
            raise TypeError(f"devices must be a list of device ordinals, not {type(devices).__name__}")
        devices = list(devices)
        for i, d in enumerate(devices):
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise ValueError(f"devices: {d!r} is not a device ordinal")
            if d in devices[:i]:
                raise ValueError(f"devices: {d} is given twice")
    sized = initial_pool_size is not None or maximum_pool_size is not None
    if isinstance(resource, str) and resource not in KINDS:
        try:
            make = parse_spec(resource)
        except ValueError as exc:
            raise ValueError(f"resource: {exc}") from None
        if sized or release_threshold is not None:
            raise ValueError("initial_pool_size/maximum_pool_size/release_threshold do not apply to a "
                             "resource spec: give the sizes in the spec")
    elif resource is None or isinstance(resource, str):
        make = resource or "pool"
        if make in ("vmm", "managed", "cuda") and sized:
            raise ValueError(f"initial_pool_size/maximum_pool_size do not apply to resource={make!r}")
        if make in ("pool", "managed", "cuda") and release_threshold is not None:
            raise ValueError(f"release_threshold does not apply to resource={make!r}")
        lo = _fraction_or_size(initial_pool_size, "initial_pool_size", None)
        hi = _fraction_or_size(maximum_pool_size, "maximum_pool_size", None)
        _fraction_or_size(release_threshold, "release_threshold", None)
        if hi == 0:
            raise ValueError("maximum_pool_size must be positive")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"initial_pool_size ({lo} bytes) exceeds maximum_pool_size ({hi} bytes)")
    elif callable(resource) and not isinstance(resource, MemoryResource):
        if sized or release_threshold is not None:
            raise ValueError("initial_pool_size/maximum_pool_size/release_threshold do not apply to a "
                             "factory: give the sizes to the resources it builds")
        make = resource
    else:
        raise TypeError(f"resource must be one of {KINDS}, a spec string or a callable(device), "
                        f"not {type(resource).__name__}")
    if log_file is not None and not isinstance(log_file, (str, os.PathLike)):
        raise TypeError(f"log_file must be a path, not {type(log_file).__name__}")
    return devices, make


def _base(kind, device: int, drv, initial, maximum, threshold):
    from .resources import (CudaMemoryResource, DeviceMemoryResource, DeviceMemoryResourceOptions,
                            ManagedMemoryResource, PoolResource, VirtualMemoryResource,
                            VirtualMemoryResourceOptions)
    if kind == "pool":
        up = (DeviceMemoryResource(device, driver=drv) if drv.device_capability(device, "memory_pools_supported")
              else CudaMemoryResource(device, driver=drv))
        return PoolResource(up, initial or 0, maximum, driver=drv)
    if kind == "device":
        if initial is None and maximum is None and threshold is None:
            return DeviceMemoryResource(device, driver=drv)  # the device's default pool, as CuPy/PyTorch share it
        opts = DeviceMemoryResourceOptions(initial_size=initial or 0, max_size=maximum or 0,
                                           release_threshold=threshold)
        return DeviceMemoryResource(device, opts, driver=drv)
    if kind == "vmm":
        return VirtualMemoryResource(device, VirtualMemoryResourceOptions(release_threshold=threshold), driver=drv)
    if kind == "managed":
        return ManagedMemoryResource(device, driver=drv)
    return CudaMemoryResource(device, driver=drv)


_RMM_KEYWORDS = ("pool_allocator", "managed_memory", "logging", "log_file_name")


def _rmm_keywords(resource, log_file, rmm: dict):
    """``rmm.reinitialize``'s keywords as mrkit's ``resource`` and ``log_file``."""
    for key in rmm:
        if key not in _RMM_KEYWORDS:
            raise TypeError(f"reinitialize() got an unexpected keyword argument {key!r}")
    pool, managed = rmm.get("pool_allocator", False), rmm.get("managed_memory", False)
    logging, name = rmm.get("logging", False), rmm.get("log_file_name")
    for key in ("pool_allocator", "managed_memory", "logging"):
        if not isinstance(rmm.get(key, False), bool):
            raise TypeError(f"{key} must be True or False, not {rmm[key]!r}")
    if pool or managed:
        if resource is not None:
            raise TypeError("give resource= or RMM's pool_allocator=/managed_memory=, not both")
        resource = "pool(managed)" if pool and managed else ("pool" if pool else "managed")
    if logging or name is not None:
        if not logging:
            raise ValueError("log_file_name is RMM's keyword for logging=True; give log_file= (mrkit's) instead")
        if name is None:
            raise ValueError("logging=True needs log_file_name= (or give mrkit's log_file=)")
        if log_file is not None:
            raise TypeError("give log_file= or RMM's logging=True, log_file_name=, not both")
        log_file = name
    return resource, log_file


def _check_packages(cupy: bool, numba: bool) -> None:
    """The packages ``cupy=True`` / ``numba=True`` need, before anything changes."""
    import importlib.util
    import sys

    def present(module: str) -> bool:
        if sys.modules.get(module) is not None:  # imported already (or set up by a test)
            return True
        try:
            return importlib.util.find_spec(module) is not None
        except (ValueError, ImportError):
            return False

    wanted = {"cupy": cupy, "numba": numba}
    for flag, module, install in (("cupy", "cupy", "cupy-cuda13x' (or 'mrkit[cupy]"),
                                  ("numba", "numba", "numba-cuda' (or 'mrkit[numba]")):
        if wanted[flag] and not present(module):
            raise ModuleNotFoundError(f"reinitialize: {flag}=True needs {module}, which is not installed: "
                                      f"pip install '{install}'; nothing was changed", name=module)


def reinitialize(resource=None, *, devices=None, initial_pool_size=None, maximum_pool_size=None,
                 release_threshold=None, log_file=None, statistics: bool = False, tracking: bool = False,
                 cupy: bool = False, numba: bool = False, **rmm) -> dict[int, MemoryResource]:
    """Set up the current resource of each device and return ``{device: resource}`` for those built now.

    resource: a kind (``"pool"``: :class:`PoolResource` over the driver's pool; ``"device"``: the
        driver's pool itself, its own pool when sizes are given; ``"vmm"``; ``"managed"``; ``"cuda"``),
        a resource spec string (``"statistics(pool(device))"``, sizes in the spec), or a factory
        ``callable(device) -> MemoryResource``. ``None`` with nothing else: back to the defaults
        (``MRKIT_RESOURCE`` or the driver's pool), closing the logs a previous call opened.
    devices: ordinals to set up now; ``None``: every device, each built on first use.
    initial_pool_size, maximum_pool_size: bytes, a size string (``"8 GiB"``) or a fraction of the
        device's memory (``0.5``); for ``"pool"`` and ``"device"``. release_threshold: for
        ``"device"`` and ``"vmm"`` (bytes kept reserved across synchronisations / free mapped bytes
        tolerated).
    log_file: one RMM-format CSV log per device (``mem.csv``, ``mem.device1.csv``; or put ``{device}``
        in the name). statistics / tracking: wrap each device's resource in those adaptors.
    cupy / numba: also make mrkit CuPy's allocator (one for every device) / Numba's memory manager.
    RMM's keywords work too: ``pool_allocator=True`` (``"pool"``), ``managed_memory=True``
    (``"managed"``, or ``"pool(managed)"`` with both), ``logging=True, log_file_name=...``.

    Arguments are all checked before anything changes, the packages ``cupy``/``numba`` need included:
    a bad one raises ``ValueError``/``TypeError`` (``ModuleNotFoundError`` for a missing package)
    naming it and leaves every device's resource as it was."""
    resource, log_file = _rmm_keywords(resource, log_file, rmm)
    devices, make = check_arguments(resource, devices=devices, initial_pool_size=initial_pool_size,
                                    maximum_pool_size=maximum_pool_size, release_threshold=release_threshold,
                                    log_file=log_file, statistics=statistics, tracking=tracking, cupy=cupy,
                                    numba=numba)
    _check_packages(cupy, numba)
    drv = get_driver()
    count = drv.device_count()
    for d in devices or ():
        if d >= count:
            raise ValueError(f"devices: {d!r} is not a device ordinal (this machine has {count})")
    if isinstance(make, Node):  # a parsed spec
        node = make
        make = lambda d: build_resource(node, drv, d)  # noqa: E731
    elif isinstance(make, str):
        kind = make
        # the sizes against every device they will apply to (fractions of each one's memory)
        for d in devices if devices is not None else range(count):
            total = drv.device_total_mem(d)
            lo = _fraction_or_size(initial_pool_size, "initial_pool_size", total)
            hi = _fraction_or_size(maximum_pool_size, "maximum_pool_size", total)
            if hi == 0:
                raise ValueError("maximum_pool_size must be positive")
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"initial_pool_size ({lo} bytes) exceeds maximum_pool_size ({hi} bytes)")

        def make(d):
            total = drv.device_total_mem(d)
            return _base(kind, d, drv, _fraction_or_size(initial_pool_size, "initial_pool_size", total),
                         _fraction_or_size(maximum_pool_size, "maximum_pool_size", total),
                         _fraction_or_size(release_threshold, "release_threshold", total))

    sized = initial_pool_size is not None or maximum_pool_size is not None
    reset = (resource is None and devices is None and not sized and release_threshold is None
             and log_file is None and not statistics and not tracking)
    opened: list[LoggingAdaptor] = []

    def build(d: int) -> MemoryResource:
        mr = make(d)
        if not isinstance(mr, MemoryResource):
            raise TypeError(f"resource factory returned {type(mr).__name__} for device {d}, not a MemoryResource")
        if log_file is not None:
            mr = LoggingAdaptor(mr, _device_path(str(Path(log_file)), d))
            opened.append(mr)
            _owned_logs.append(mr)
        if tracking:
            mr = TrackingAdaptor(mr)
        if statistics:
            mr = StatisticsAdaptor(mr)
        return mr

    built = {}
    try:
        for d in devices or ():
            built[d] = build(d)
    except BaseException:
        for log in opened:
            log.close()
        _owned_logs[:] = [log for log in _owned_logs if not any(log is o for o in opened)]
        raise
    # nothing can fail from here on: swap
    for log in [log for log in _owned_logs if not any(log is o for o in opened)]:
        _owned_logs.remove(log)
        log.close()
    if reset:
        _current.rebuild_all(None)
    elif devices is None:
        _current.rebuild_all(build)
    for d, mr in built.items():
        _current.set_current_resource(mr, d)
    if cupy:
        from .integrations.cupy import install
        install()
    if numba:
        from .integrations.numba import install as install_numba
        install_numba()
    return built
