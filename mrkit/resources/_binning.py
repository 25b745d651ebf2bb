"""``BinningResource``: size classes in front of any upstream, on the shared engine."""
from __future__ import annotations

import threading

from .._engine import GRAIN, Arena, CachingResource
from .._resource import DEFAULT_ALIGNMENT, MemoryResource, check_request, closed_resource, size_mismatch, still_live, unknown_pointer
from .._sizes import parse_size
from ..driver import Driver
from ._pool import UpstreamCachingResource, UpstreamChunks

__all__ = ["BinningResource"]


def _exponent(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value < 63:
        raise ValueError(f"{name} must be in [0, 62], got {value}")
    return value


class BinningResource(UpstreamCachingResource):
    """Rounds every request of up to ``max_bin`` bytes to a power-of-two size class (at least 256 B)
    and serves it from an :class:`~mrkit._engine.Arena` over ``upstream`` (chunks of ``chunk_size``),
    so blocks of one class are reused exactly, per stream, with the same stream ordering, reclaim
    and thread safety as :class:`~mrkit.PoolResource`. Larger requests, and alignments above 256,
    go straight to ``upstream`` (like RMM's ``binning_memory_resource`` over its fallback).

    RMM's ``min_size_exponent=``/``max_size_exponent=`` name the smallest and largest bins as powers
    of two (``max_size_exponent`` instead of ``max_bin``).

    A free must name the size allocated (``ValueError`` otherwise, nothing changed)."""

    __slots__ = ("max_bin", "min_bin", "_bin_alloc", "_bin_free", "_sizes",
                 "_large", "_lock")

    def __init__(self, upstream: MemoryResource, max_bin: int | str | None = None, *,
                 chunk_size: int | str = "4 MiB", driver: Driver | None = None,
                 min_size_exponent: int | None = None, max_size_exponent: int | None = None) -> None:
        self._set_upstream(upstream, driver)
        if max_size_exponent is not None:  # RMM's binning_memory_resource: bins 2**min .. 2**max
            if max_bin is not None:
                raise TypeError("give max_bin or max_size_exponent (RMM's name), not both")
            max_bin = 1 << _exponent(max_size_exponent, "max_size_exponent")
        min_bin = GRAIN
        if min_size_exponent is not None:
            min_bin = max(GRAIN, 1 << _exponent(min_size_exponent, "min_size_exponent"))
        mb = parse_size("1 MiB" if max_bin is None else max_bin, "max_bin")
        if min_bin > mb:
            raise ValueError(f"min_size_exponent gives bins of {min_bin} bytes, above max_bin {mb}")
        self.min_bin = min_bin
        if mb < GRAIN or mb & (mb - 1):
            raise ValueError(f"max_bin must be a power of two >= {GRAIN}, got {mb}")
        chunk = parse_size(chunk_size, "chunk_size")
        if chunk < mb:
            raise ValueError(f"chunk_size {chunk} must be at least max_bin {mb}")
        self.max_bin = mb
        src = UpstreamChunks(upstream, None, 0.0, -(-chunk // GRAIN) * GRAIN)
        self._attach(Arena(src, self, device_id=self.device_id, driver=self.driver,
                           ordered=upstream.device_accessible))
        self._bin_alloc, self._bin_free = self.arena.allocate, self.arena.deallocate
        self._sizes: dict[int, int] = {}  # ptr -> nbytes as requested (binned blocks)
        self._large: dict[int, int] = {}  # ptr -> nbytes (served by the upstream)
        self._lock = threading.Lock()
        # the instance's allocate/deallocate are the binning front end, not the arena's own paths
        CachingResource.__dict__["allocate"].__set__(self, self._allocate)
        CachingResource.__dict__["deallocate"].__set__(self, self._deallocate)

    @property
    def max_alignment(self) -> int:
        return self.upstream.max_alignment  # alignments above 256 are the upstream's to serve

    def bin_size(self, nbytes: int) -> int:
        """The size class of a request of ``nbytes`` (``nbytes`` itself above ``max_bin``)."""
        if nbytes > self.max_bin:
            return nbytes
        return max(self.min_bin, 1 << (nbytes - 1).bit_length())

    def _allocate(self, nbytes, stream, alignment=256):
        if type(nbytes) is not int or nbytes <= 0 or alignment is not DEFAULT_ALIGNMENT:
            nbytes = check_request(nbytes, alignment, self.max_alignment)
        if nbytes == 0:
            return self._bin_alloc(0, stream)  # validates the stream, returns 0
        if nbytes > self.max_bin or alignment > GRAIN:
            if self.arena.closed:
                raise closed_resource(self)
            ptr = self.upstream.allocate(nbytes, stream, alignment)
            self._large[ptr] = nbytes
            return ptr
        ptr = self._bin_alloc(max(self.min_bin, 1 << (nbytes - 1).bit_length()), stream)
        self._sizes[ptr] = nbytes
        return ptr

    def _deallocate(self, ptr, nbytes, stream, alignment=256):
        if type(nbytes) is not int or alignment is not DEFAULT_ALIGNMENT:
            nbytes = check_request(nbytes, alignment, 1 << 62)
        n = self._sizes.get(ptr)
        if n is not None:
            if n != nbytes:
                raise size_mismatch(nbytes, n, ptr)
            if alignment > GRAIN:
                raise ValueError(f"alignment {alignment} does not match the allocation at {ptr:#x} "
                                 f"(made with an alignment of at most {GRAIN})")
            # forget the block before it goes back: once freed, another thread may be handed the
            # same address and record it here, which a later ``del`` would wipe out
            del self._sizes[ptr]
            try:
                self._bin_free(ptr, max(self.min_bin, 1 << (nbytes - 1).bit_length()), stream)
            except BaseException:
                self._sizes[ptr] = n  # refused (a bad stream): the block is still the caller's
                raise
            return
        with self._lock:
            n = self._large.get(ptr)
            if n is None:
                if ptr == 0 and nbytes == 0:
                    return
                raise unknown_pointer(ptr, self)
            if n != nbytes:
                raise size_mismatch(nbytes, n, ptr)
            del self._large[ptr]
        self.upstream.deallocate(ptr, nbytes, stream, alignment)

    @property
    def live_bytes(self) -> int:
        return sum(list(self._sizes.values())) + sum(list(self._large.values()))

    @property
    def pool_size(self) -> int:
        """Bytes held from the upstream for the size classes."""
        return self.arena.held

    def release(self) -> int:
        """Give wholly free chunks back upstream (safe while other threads allocate)."""
        return self.arena.release()

    trim = release

    def close(self) -> None:
        """Give every chunk back upstream; raises ``ValueError`` if allocations are still live (binned or
        served by the upstream), changing nothing. Afterwards an allocation is a ``ValueError``."""
        arena = self.arena
        with arena.lock, self._lock:
            n = len(self._sizes) + len(self._large)
            if n:
                raise still_live(self, n)
            arena.closed = True
        self.release()
        arena.close_event()

    def _describe(self) -> str:
        return f"{self.upstream!r}, max_bin={self.max_bin}"


# the hot paths are stored on the instance under ``allocate``/``deallocate``: a call missing an argument
# names them so ("BinningResource.allocate() missing ... 'stream'"), not by their private names
for _f, _name in ((BinningResource._allocate, "allocate"), (BinningResource._deallocate, "deallocate")):
    _f.__name__, _f.__qualname__ = _name, f"BinningResource.{_name}"
del _f, _name
