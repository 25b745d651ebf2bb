"""``Adaptor``: a resource that wraps an upstream resource and forwards what it does not change."""
from __future__ import annotations

from .._resource import MemoryResource, UpstreamAccess, upstream_chain as _chain

__all__ = ["Adaptor"]


class Adaptor(UpstreamAccess, MemoryResource):
    """Base of every adaptor. Keeps a strong reference to ``upstream``; forwards
    ``device_accessible``, ``host_accessible``, ``device_id``, ``max_alignment`` and ``driver``.
    Equality is identity: two adaptors never share their bookkeeping."""

    __slots__ = ("upstream", "_up_alloc", "_up_free")

    def __init__(self, upstream: MemoryResource) -> None:
        if not isinstance(upstream, MemoryResource):
            raise TypeError(f"upstream must be a MemoryResource, not {type(upstream).__name__}")
        self.upstream = upstream
        self._up_alloc = upstream.allocate  # hoisted: one attribute look-up saved per call
        self._up_free = upstream.deallocate

    @property
    def device_id(self):
        return self.upstream.device_id

    @property
    def max_alignment(self) -> int:
        return self.upstream.max_alignment

    @property
    def driver(self):
        return getattr(self.upstream, "driver", None)

    def allocate(self, nbytes, stream, alignment=256):
        return self._up_alloc(nbytes, stream, alignment)

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        self._up_free(ptr, nbytes, stream, alignment)

    def __getattr__(self, name):
        # Resource-specific helpers of the stack (release, trim, pool, live_bytes...) stay reachable.
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            return getattr(self.upstream, name)
        except AttributeError:
            pass
        below = " -> ".join(type(m).__name__ for m in _chain(self)[1:])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                             f"(nor has any resource below it: {below})", name=name, obj=self)

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return id(self)

    def _describe(self) -> str:
        return repr(self.upstream)
