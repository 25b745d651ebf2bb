"""mrkit: stream-ordered memory resources for CUDA in Python.

Compose resources (where memory comes from) with adaptors (what happens around each allocation)
and plug the result into array libraries. See ``docs/`` for the guide.
"""
from ._errors import CUDAError, CUDAUnavailableError, MrkitError, OutOfMemoryError, StreamOrderViolation
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
    TrackingAdaptor, read_log, replay,
)

from ._spec import parse_spec, resource_from_spec
from ._current import get_current_resource, set_current_resource, set_resource_factory, using
from ._setup import reinitialize
from ._snapshot import dump_snapshot, snapshot, snapshot_from_log

__version__ = "0.1.0"


from ._current import env_spec as _env_spec

_env_spec()  # a bad MRKIT_RESOURCE fails at import, naming the variable and the position

__all__ = [
    "MrkitError", "CUDAError", "CUDAUnavailableError", "OutOfMemoryError", "StreamOrderViolation",
    "MemoryResource", "Buffer", "get_current_resource", "set_current_resource", "using",
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
