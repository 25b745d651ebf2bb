"""mrkit: stream-ordered memory resources for CUDA in Python.

Compose resources (where memory comes from) with adaptors (what happens around each allocation)
and plug the result into array libraries. See ``docs/`` for the guide.
"""
from ._errors import (CUDAError, CUDAUnavailableError, MrkitError, OutOfMemoryError, SimulatorFallbackWarning,
                      StreamOrderViolation)
from ._resource import Buffer, MemoryResource
from ._sizes import format_size, parse_size
from ._stream import DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM, Event, Stream, as_stream
from .driver import get_driver, set_backend, use_backend
from .resources import (
    CudaMemoryResource, DeviceMemoryResource, DeviceMemoryResourceOptions, HostMemoryResource,
    BinningResource, ManagedMemoryResource, MemoryPool, PinnedMemoryResource, PoolResource, VirtualMemoryResource,
    VirtualMemoryResourceOptions,
)
from .adaptors import (
    Adaptor, LimitingAdaptor, LoggingAdaptor, RetryAdaptor, Statistics, StatisticsAdaptor,
    TrackingAdaptor, read_log,
)

from ._spec import parse_spec, replay, resource_from_spec
from ._current import (get_current_device_resource, get_current_resource, set_current_device_resource,
                       set_current_resource, set_resource_factory, using)
from ._setup import reinitialize
from ._snapshot import dump_snapshot, snapshot, snapshot_from_log

__version__ = "0.1.0"

# MRKIT_BACKEND and MRKIT_RESOURCE are read at first use (a bad one raises there, naming the variable),
# never at import: `mrkit --help` and `import mrkit` work whatever the environment says.

__all__ = [
    "MrkitError", "CUDAError", "CUDAUnavailableError", "OutOfMemoryError", "StreamOrderViolation",
    "SimulatorFallbackWarning",
    "MemoryResource", "Buffer", "get_current_resource", "set_current_resource", "using",
    "get_current_device_resource", "set_current_device_resource",
    "set_resource_factory", "reinitialize",
    "parse_size", "format_size",
    "Stream", "Event", "DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM", "as_stream",
    "get_driver", "set_backend", "use_backend",
    "CudaMemoryResource", "DeviceMemoryResource", "DeviceMemoryResourceOptions", "HostMemoryResource",
    "ManagedMemoryResource", "MemoryPool", "PinnedMemoryResource", "VirtualMemoryResource",
    "VirtualMemoryResourceOptions",
    "PoolResource", "BinningResource",
    "Adaptor", "LimitingAdaptor", "LoggingAdaptor", "RetryAdaptor", "Statistics", "StatisticsAdaptor",
    "TrackingAdaptor", "read_log", "replay",
    "parse_spec", "resource_from_spec", "snapshot", "dump_snapshot", "snapshot_from_log",
    "__version__",
]


# RMM's and CuPy's names that mrkit spells differently: a missing one says what to use instead.
_HINTS = {
    "get_per_device_resource": "get_current_resource(device)",
    "set_per_device_resource": "set_current_resource(mr, device)",
    "PoolMemoryResource": "PoolResource(upstream, initial_pool_size=..., maximum_pool_size=...)",
    "CudaAsyncMemoryResource": "DeviceMemoryResource(device)",
    "BinningMemoryResource": "BinningResource(upstream, min_size_exponent=..., max_size_exponent=...)",
    "ArenaMemoryResource": "PoolResource (per-stream arenas are built in)",
    "SystemMemoryResource": "HostMemoryResource() or ManagedMemoryResource(device)",
    "LimitingResourceAdaptor": "LimitingAdaptor(upstream, limit)",
    "StatisticsResourceAdaptor": "StatisticsAdaptor(upstream)",
    "LoggingResourceAdaptor": "LoggingAdaptor(upstream, path)",
    "TrackingResourceAdaptor": "TrackingAdaptor(upstream)",
    "FailureCallbackResourceAdaptor": "RetryAdaptor(upstream, callback)",
    "DeviceBuffer": "Buffer (or mr.allocate_buffer(nbytes))",
    "enable_logging": "reinitialize(log_file=...) or LoggingAdaptor(upstream, path)",
    "mr": "PoolResource, mrkit.DeviceMemoryResource and the other top-level names",
    "rmm_cupy_allocator": "mrkit.cupy.allocator() or mrkit.cupy.install()",
    "get_default_memory_pool": "mrkit.get_current_resource() (and mrkit.cupy.install() to route CuPy to it)",
}


def __getattr__(name: str):
    hint = _HINTS.get(name)
    if hint is None:
        raise AttributeError(f"module 'mrkit' has no attribute {name!r}")
    raise AttributeError(f"mrkit has no {name!r} (RMM's or CuPy's name); use mrkit.{hint} "
                         "(docs/guide.md: 'Coming from RMM or CuPy')")
