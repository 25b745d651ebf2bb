"""``PoolResource``: a stream-ordered coalescing sub-allocator over any upstream resource."""
from __future__ import annotations

from .._engine import GRAIN, Arena, CachingResource, ChunkSource
from .._errors import OutOfMemoryError
from .._resource import MemoryResource, UpstreamAccess, still_live
from .._sizes import format_size, parse_size
from .._stream import DEFAULT_STREAM, Stream
from ..driver import Driver

__all__ = ["PoolResource", "UpstreamCachingResource", "UpstreamChunks"]

_MEDIUM = 1 << 20  # requests past this size and below ``large_chunk`` share chunks of ``large_chunk``


def _grains(value, name: str) -> int:
    """A size argument (an int or a size string) rounded up to whole grains of the engine."""
    return -(-parse_size(value, name) // GRAIN) * GRAIN


class UpstreamChunks(ChunkSource):
    """Chunks allocated from an upstream resource and given back to it whole."""

    __slots__ = ("upstream", "maximum_size", "growth_factor", "min_chunk", "large_chunk")

    def __init__(self, upstream: MemoryResource, maximum_size, growth_factor: float, min_chunk: int,
                 large_chunk: int = 0) -> None:
        self.upstream, self.maximum_size = upstream, maximum_size
        self.growth_factor, self.min_chunk, self.large_chunk = growth_factor, min_chunk, large_chunk

    def grow(self, arena: Arena, size: int, stream: Stream, exact: bool):
        held = arena.held
        least = self.large_chunk if _MEDIUM < size < self.large_chunk else self.min_chunk
        want = size if exact else max(size, least, int(held * self.growth_factor) & -GRAIN)
        if self.maximum_size is not None:
            room = self.maximum_size - held
            if size > room:
                raise OutOfMemoryError(
                    f"{arena.owner!r} cannot allocate {size} bytes ({format_size(size)}): it would exceed "
                    f"its maximum_size of {self.maximum_size} bytes (holding {held})", size, arena.owner)
            want = min(want, room)
        try:
            ptr = self.upstream.allocate(want, stream)
        except OutOfMemoryError:
            if want == size:
                raise
            want = size
            ptr = self.upstream.allocate(want, stream)
        return ptr, want, True

    def give_back(self, ptr: int, size: int, stream: Stream) -> None:
        self.upstream.deallocate(ptr, size, stream)

    def trim_upstream(self) -> bool:
        trim = getattr(self.upstream, "trim", None)
        if not callable(trim):
            return False
        trim()
        return True


class UpstreamCachingResource(UpstreamAccess, CachingResource):
    """A caching resource whose chunks come from an ``upstream`` resource (pool, binning): validates
    the upstream, takes its driver and device, and answers the accessibility properties from it."""

    __slots__ = ("upstream", "driver", "device_id")

    # CuPy's MemoryPool names, for code written against ``cupy.get_default_memory_pool()``
    def used_bytes(self) -> int:
        """Bytes handed out, as the resource holds them (rounded to its blocks): CuPy's ``used_bytes()``."""
        arena = self.arena
        with arena.lock:
            return (sum((n + GRAIN - 1) & -GRAIN for n in arena.live.values())
                    + sum(e[1] for e in arena.aligned.values()))

    def total_bytes(self) -> int:
        """Bytes held from the upstream (``pool_size``): CuPy's ``total_bytes()``."""
        return self.arena.held

    def free_all_blocks(self, stream=None) -> None:
        """Give every wholly free chunk back upstream (:meth:`release`): CuPy's ``free_all_blocks()``
        (``stream`` is accepted and ignored: every stream's free memory is pooled first)."""
        self.release()

    def _set_upstream(self, upstream: MemoryResource, driver: Driver | None) -> None:
        if not isinstance(upstream, MemoryResource):
            raise TypeError(f"upstream must be a MemoryResource, not {type(upstream).__name__}")
        self.upstream = upstream
        self.driver = driver or getattr(upstream, "driver", None)
        self.device_id = upstream.device_id


class PoolResource(UpstreamCachingResource):
    """A stream-ordered coalescing pool over any upstream resource (device pool, VMM, managed,
    pinned, cuMemAlloc, host, or any composition): an :class:`~mrkit._engine.Arena` whose chunks come
    from ``upstream``.

    **Allocation.** Sizes round up to 256 bytes. A request is served, in order, from: the exact-size
    cache of the requesting stream (the fast path: a dict look-up and a list pop); that stream's
    coalesced free list (best fit); the other streams' free memory (below); a new upstream chunk. Each
    chunk is at least ``min_chunk`` bytes (2 MiB), at least ``large_chunk`` bytes (32 MiB) for a request
    of more than 1 MiB and less than ``large_chunk`` (PyTorch's caching allocator has the same two
    kinds of segment, of 2 and 20 MiB: blocks of a few MiB then share chunks and coalesce, where a
    chunk each would keep every free block apart; ``large_chunk=0`` turns this off), and at least
    ``growth_factor`` times what the pool already holds (1.0 doubles the pool like RMM's; the default
    0.0 grows by what is needed), within ``maximum_size``. When the upstream refuses the larger chunk,
    the pool asks for the request alone. RMM's ``initial_pool_size=``/``maximum_pool_size=`` are accepted as keywords,
    and CuPy's ``used_bytes()``/``total_bytes()``/``free_all_blocks()`` as methods.

    **Streams.** Free memory belongs to the stream it was freed on, keyed by the stream's unique id
    (``cuStreamGetId``), never by its handle, so a new stream that reuses a destroyed stream's handle
    starts with nothing. A block freed on stream S is reusable on S at once. Stream T takes S's free
    memory only after T is ordered after S: the pool records one event on S and makes T wait on it,
    then moves S's whole free list to T (one event per hand-over, none per deallocation). If S may no
    longer exist, the pool synchronises the device instead.

    **Out of memory.** When the upstream refuses, the pool waits for the streams holding free memory,
    pools it, gives wholly free chunks back upstream and retries; if that fails too, it asks the
    upstream to ``trim()`` what it keeps cached (a :class:`~mrkit.DeviceMemoryResource` synchronises
    its device and trims its driver pool, which otherwise keeps freed memory reserved) and retries
    once more before raising
    :class:`~mrkit.OutOfMemoryError` naming the request, the pool's holdings and the upstream's message.

    **Errors.** A double free, a foreign pointer or a wrong size raises ``ValueError``; a size or
    alignment of the wrong type raises ``TypeError``; either leaves the pool unchanged.

    **Threads.** Every method may be called from any thread, ``release()``/``trim()`` and the
    out-of-memory reclaim concurrently with allocation: exact-size cache hits and frees take no lock;
    everything else runs under the arena's one lock, following the rules in ``docs/design.md``.
    """

    __slots__ = ("_source",)

    def __init__(self, upstream: MemoryResource, initial_size: int | str | None = None,
                 maximum_size: int | str | None = None, *, growth_factor: float = 0.0,
                 min_chunk: int | str = 2 << 20, large_chunk: int | str = 32 << 20, driver: Driver | None = None,
                 initial_pool_size: int | str | None = None, maximum_pool_size: int | str | None = None) -> None:
        lo_name, hi_name = "initial_size", "maximum_size"  # errors name the keyword the caller used
        if initial_pool_size is not None:  # RMM's names
            if initial_size is not None:
                raise TypeError("give initial_size or initial_pool_size (RMM's name), not both")
            initial_size, lo_name = initial_pool_size, "initial_pool_size"
        if maximum_pool_size is not None:
            if maximum_size is not None:
                raise TypeError("give maximum_size or maximum_pool_size (RMM's name), not both")
            maximum_size, hi_name = maximum_pool_size, "maximum_pool_size"
        self._set_upstream(upstream, driver)
        initial = _grains(0 if initial_size is None else initial_size, lo_name)
        maximum = None if maximum_size is None else parse_size(maximum_size, hi_name)
        if maximum is not None and initial > maximum:
            raise ValueError(f"{lo_name} {initial} exceeds {hi_name} {maximum}")
        if isinstance(growth_factor, bool) or not isinstance(growth_factor, (int, float)):
            raise TypeError(f"growth_factor must be a number, not {type(growth_factor).__name__}")
        if not growth_factor >= 0 or growth_factor == float("inf"):
            raise ValueError(f"growth_factor must be a finite number >= 0, got {growth_factor}")
        self._source = UpstreamChunks(upstream, maximum, float(growth_factor), _grains(min_chunk, "min_chunk"),
                                      _grains(large_chunk, "large_chunk"))
        # Host-only memory is not stream ordered: one shared free list for every stream.
        self._attach(Arena(self._source, self, device_id=self.device_id, driver=self.driver,
                           ordered=upstream.device_accessible))
        if initial:
            arena = self.arena
            with arena.lock:
                st = arena.state(DEFAULT_STREAM)
                ptr, n = arena.grow(initial, DEFAULT_STREAM, exact=True)
                st.free.insert(ptr, n, arena.boundaries)

    max_alignment = 1 << 20

    @property
    def maximum_size(self) -> int | None:
        return self._source.maximum_size

    @property
    def growth_factor(self) -> float:
        return self._source.growth_factor

    @property
    def min_chunk(self) -> int:
        return self._source.min_chunk

    @property
    def large_chunk(self) -> int:
        """The chunk a request of more than 1 MiB and less than this takes (0: none)."""
        return self._source.large_chunk

    @property
    def pool_size(self) -> int:
        """Bytes currently held from the upstream."""
        return self.arena.held

    # -- giving memory back -------------------------------------------------------------------
    def release(self) -> int:
        """Give every wholly free chunk back to the upstream; returns the bytes released.

        First waits for the streams that hold free memory (not the whole device, unless a stream
        may no longer exist), then pools their free lists on the default stream, so a chunk whose
        pieces were freed on different streams coalesces whole again and can be returned. Safe to
        call while other threads allocate."""
        return self.arena.release()

    trim = release

    def close(self) -> None:
        """Release everything; raises ``ValueError`` if allocations are still live (nothing changes).
        Afterwards an allocation is a ``ValueError``."""
        arena = self.arena
        with arena.lock:
            if arena.live or arena.aligned:
                raise still_live(self, len(arena.live) + len(arena.aligned))
            arena.closed = True
        self.release()
        arena.close_event()

    def _describe(self) -> str:
        m = self.maximum_size
        lim = "" if m is None else f", maximum_size={m}"
        return f"{self.upstream!r}{lim}"
