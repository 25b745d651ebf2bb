"""``PoolResource``: a stream-ordered coalescing sub-allocator over any upstream resource."""
from __future__ import annotations

import linecache
import re
import threading
import weakref
from bisect import bisect_left, insort

from .._errors import CUDAError, OutOfMemoryError
from .._resource import MemoryResource, check_request
from .._sizes import format_size, parse_size
from .._stream import DEFAULT_STREAM, Stream, as_stream, check_stream
from ..driver import Driver, get_driver

__all__ = ["PoolResource"]

_GRAIN = 256  # every block size and offset is a multiple of this


class _FreeList:
    """Free blocks of one stream: a size-sorted list for best fit plus address maps for O(1)
    neighbour coalescing. Blocks never merge across an upstream-chunk boundary."""

    __slots__ = ("sizes", "start", "end")

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int]] = []
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}

    def _add(self, ptr: int, size: int) -> None:
        insort(self.sizes, (size, ptr))
        self.start[ptr] = size
        self.end[ptr + size] = ptr

    def _remove(self, ptr: int, size: int) -> None:
        del self.sizes[bisect_left(self.sizes, (size, ptr))]
        del self.start[ptr]
        del self.end[ptr + size]

    def insert(self, ptr: int, size: int, boundaries) -> None:
        # _remove and _add inlined: this runs for every block that reaches the free list
        sizes, start, end = self.sizes, self.start, self.end
        nxt = ptr + size
        nsize = start.get(nxt)
        if nsize is not None and nxt not in boundaries:
            del sizes[bisect_left(sizes, (nsize, nxt))]
            del start[nxt]
            del end[nxt + nsize]
            size += nsize
        prev = end.get(ptr)
        if prev is not None and ptr not in boundaries:
            psize = start.pop(prev)
            del sizes[bisect_left(sizes, (psize, prev))]
            del end[ptr]
            ptr, size = prev, size + psize
        insort(sizes, (size, ptr))
        start[ptr] = size
        end[ptr + size] = ptr

    def take(self, size: int, spare: int | None = None) -> int | None:
        """Best fit; the block at ``spare`` only when nothing else fits."""
        sizes = self.sizes
        i = bisect_left(sizes, (size, 0))
        if i == len(sizes):
            return None
        bsize, ptr = sizes[i]
        if ptr == spare and i + 1 < len(sizes):
            i += 1
            bsize, ptr = sizes[i]
        del sizes[i]  # _remove and _add inlined: this runs on every allocation that misses the cache
        start, end = self.start, self.end
        del start[ptr]
        if bsize > size:
            rest, rsize = ptr + size, bsize - size
            insort(sizes, (rsize, rest))
            start[rest] = rsize
            end[ptr + bsize] = rest
        else:
            del end[ptr + bsize]
        return ptr

    def largest(self) -> int:
        return self.sizes[-1][0] if self.sizes else 0

    def total(self) -> int:
        return sum(s for s, _ in self.sizes)


def _drain(lst: list):
    """Pop every element of ``lst`` with atomic pops: with lock-free appenders and poppers around,
    each element is taken by exactly one party."""
    pop = lst.pop
    while lst:
        try:
            yield pop()
        except IndexError:
            return


class _StreamState:
    """Free memory owned by one stream: an exact-size cache (the fast path) and a coalesced list."""

    __slots__ = ("stream", "cache", "free")

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.cache: dict[int, list[int]] = {}
        self.free = _FreeList()

    def flush(self, boundaries) -> None:
        """Coalesce the exact-size cache into the free list (pool lock held).

        Lock-free fast paths may still hold one of the cache's lists: the dict is swapped first, then
        each list is drained with atomic pops, so every block is taken by exactly one party; a block
        appended to a list after it was drained is rescued by the deallocating thread."""
        free = self.free
        old, self.cache = self.cache, {}
        # list(): a lock-free free may still add a key to the old dict (it then rescues its block)
        insert = free.insert
        for size, ptrs in list(old.items()):
            pop = ptrs.pop
            while ptrs:  # atomic pops (see _drain), inlined
                try:
                    p = pop()
                except IndexError:
                    break
                insert(p, size, boundaries)

    def empty(self) -> bool:
        return not self.free.sizes and not any(list(self.cache.values()))

    def bytes(self) -> int:
        return self.free.total() + sum(s * len(v) for s, v in list(self.cache.items()))


class _OneState(dict):
    """The states of a pool that is not stream ordered: every stream id maps to key 0."""

    def get(self, key, default=None):
        return dict.get(self, 0, default)


# The pool's hot path, written once and compiled in three variants. Untagged lines are in all of them;
# a line tagged "#E" is in the two with an explicit stream (the pool's own methods), "#S" adds
# statistics events (the variant StatisticsAdaptor fuses in), "#H" is in the variant for allocator hooks
# that name no stream and free by pointer alone (CuPy's): it looks up the caller's current stream and
# remembers each block's stream until it is freed.
_HOT_SOURCE = """
def allocate(nbytes, stream, alignment=256):  #E
    if type(stream) is not Stream:  #E
        stream = as_stream(stream)  #E
def allocate(nbytes, device_id, alignment=256):  #H
    if device_id != device:  #H
        wrong_device(device_id)  #H
    cs = current_stream(device_id)  #H
    ref, stream = seen[0]  #H
    if ref() is not cs:  #H
        stream = remember(cs)  #H
    if type(nbytes) is not int or nbytes <= 0 or alignment != 256:
        ptr = allocate_slow(nbytes, stream, alignment)
        if ptr:  #S
            record(nbytes)  #S
        if ptr:  #H
            where[ptr] = stream  #H
        return ptr
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        lst = st.cache.get(size)
        if lst:
            try:
                ptr = lst.pop()
            except IndexError:
                pass
            else:
                live[ptr] = nbytes
                record(nbytes)  #S
                where[ptr] = stream  #H
                return ptr
    with lock:
        ptr = take(size, stream, st)
        live[ptr] = nbytes
    record(nbytes)  #S
    where[ptr] = stream  #H
    return ptr


def deallocate(ptr, nbytes, stream, alignment=256):  #E
    if type(stream) is not Stream:  #E
        stream = as_stream(stream)  #E
def deallocate(ptr, device_id, alignment=256):  #H
    stream = where_pop(ptr, None)  #H
    if stream is None:  #H
        return foreign_free(ptr)  #H
    n = live_pop(ptr, None)
    nbytes = -1 if n is None else n  #H  (-1: not live, so the slow path names the bad pointer)
    if n != nbytes or alignment > 256:
        if n is not None:
            live[ptr] = n
        with lock:
            deallocate_slow(ptr, nbytes, stream, alignment)
        if ptr:  #S
            record(-nbytes)  #S
            if len(events) > limit:  #S
                on_full()  #S
        return
    record(-nbytes)  #S
    if len(events) > limit:  #S  checked on frees only: pending events stay within limit + live blocks
        on_full()  #S
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        cache = st.cache
        lst = cache.get(size)
        if lst is None:  # first block of this size: insert-or-get, one atomic dict operation
            new = [ptr]
            lst = cache.setdefault(size, new)
            if lst is not new:
                lst.append(ptr)
        else:
            lst.append(ptr)
        # Every path that detaches a cache (a flush, a hand-over, retiring a stream's state)
        # swaps st.cache first, so this one test tells whether the block landed in a live list.
        if st.cache is cache:
            return
        with lock:  # a flush or hand-over replaced the list meanwhile: rescue it
            rescue(lst, size, stream)
        return
    with lock:
        cache_block(ptr, size, stream)
"""


_TAG = re.compile(r"  #([ESH])(?:\s|$)")


def _compile_hot(tags: str, name: str):
    lines = [ln for ln in _HOT_SOURCE.splitlines() if (m := _TAG.search(ln)) is None or m.group(1) in tags]
    source = "\n".join(lines) + "\n"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # readable tracebacks
    return compile(source, name, "exec")


_HOT_VARIANTS = {"plain": _compile_hot("E", "<mrkit pool hot path>"),
                 "counting": _compile_hot("ES", "<mrkit pool hot path, counting>"),
                 "hook": _compile_hot("H", "<mrkit pool hot path, allocator hook>")}


def _hot_paths(pool: "PoolResource", variant: str = "plain", **names):
    """The pool's ``allocate`` and ``deallocate`` in one of the variants of ``_HOT_SOURCE``: functions
    whose globals are the pool's own structures and bound methods (so a call makes no attribute look-up
    on ``self``) plus ``names``, the variant's own:

    * ``counting``: ``events`` (the list each successful call appends ``+nbytes``/``-nbytes`` to),
      ``on_full`` and ``limit`` (``on_full()`` runs when a free finds more than ``limit`` events
      pending) — how :class:`~mrkit.StatisticsAdaptor` counts without a frame of its own;
    * ``hook``: ``allocate(nbytes, device_id)`` and ``deallocate(ptr, device_id)`` for CuPy's
      ``PythonFunctionAllocator``: ``device``, ``wrong_device(device_id)`` (raises), ``current_stream(
      device_id)``, ``seen`` (a one-element list holding ``(weakref to the last stream object, its mrkit
      Stream)``), ``remember(stream_object)`` (converts and updates ``seen``) and ``foreign_free(ptr)``
      (a pointer it never handed out); the variant keeps each live block's stream itself.

    Cache hits take no lock: a list pop, a list append and dict stores are each atomic, every block
    is popped by exactly one thread, and anything that restructures the caches holds the lock and
    drains lists with atomic pops (see _StreamState.flush)."""
    live = pool._live
    ns = {"Stream": Stream, "as_stream": pool._as_stream, "live": live, "live_pop": live.pop,
          "lock": pool._lock, "states_get": pool._states.get, "take": pool._take,
          "allocate_slow": pool._allocate_slow, "deallocate_slow": pool._deallocate_slow,
          "rescue": pool._rescue, "cache_block": pool._cache_block}
    if variant == "counting":
        names["record"] = names["events"].append
    elif variant == "hook":
        where = names["where"] = {}
        names["where_pop"] = where.pop
    ns.update(names)
    exec(_HOT_VARIANTS[variant], ns)
    return ns["allocate"], ns["deallocate"]


class PoolResource(MemoryResource):
    """A stream-ordered coalescing pool over any upstream resource (device pool, VMM, managed,
    pinned, cuMemAlloc, host, or any composition).

    **Allocation.** Sizes round up to 256 bytes. A request is served, in order, from: the exact-size
    cache of the requesting stream (the fast path: a dict look-up and a list pop); that stream's
    coalesced free list (best fit on a size-sorted list; the remainder stays free); the other
    streams' free memory (below); a new upstream chunk. Each chunk is at least ``min_chunk`` bytes and
    at least ``growth_factor`` times what the pool already holds (geometric growth: 1.0 doubles the
    pool like RMM's; the default 0.0 grows by what is needed, which kept the footprint below CuPy's
    on the multi-stream benchmark), within ``maximum_size``.

    **Streams.** Free memory belongs to the stream it was freed on, keyed by the stream's unique id
    (``cuStreamGetId``), never by its handle, so a new stream that reuses a destroyed stream's handle
    starts with nothing. A block freed on stream S is reusable on S at once. Stream T takes S's free
    memory only after T is ordered after S: the pool records one event on S and makes T wait on it,
    then moves S's whole free list to T (one event per hand-over, none per deallocation). If S may
    no longer exist (an owning mrkit stream that was closed, a CuPy/PyTorch stream object that was
    garbage-collected, a raw handle whose lifetime mrkit cannot know), the pool synchronises the
    device instead, after which S's blocks are idle and safe for anyone.

    **Out of memory.** When the upstream refuses, the pool synchronises the device, pools every
    stream's free memory, gives fully free chunks back upstream and retries once before raising
    :class:`~mrkit.OutOfMemoryError` naming the request, the pool's holdings and the upstream's
    message.

    **Errors.** A double free, a foreign pointer or a wrong size raises ``ValueError`` and leaves the
    pool unchanged. **Threads:** exact-size cache hits and frees take no lock (they are single atomic
    list and dict operations); everything else — free lists, coalescing, hand-overs between streams,
    growth, trimming, and the upstream calls they make — runs under one lock. Nothing is handed out
    twice and nothing is lost.
    """

    # allocate/deallocate are per-instance functions (see _hot_paths), set in __init__
    __slots__ = ("upstream", "driver", "device_id", "maximum_size", "growth_factor", "min_chunk",
                 "_lock", "_live", "_aligned", "_states", "_chunks", "_boundaries", "_held",
                 "_event", "_ordered", "allocate", "deallocate")

    def __init__(self, upstream: MemoryResource, initial_size: int | str = 0,
                 maximum_size: int | str | None = None, *, growth_factor: float = 0.0,
                 min_chunk: int | str = 2 << 20, driver: Driver | None = None) -> None:
        if not isinstance(upstream, MemoryResource):
            raise TypeError(f"upstream must be a MemoryResource, not {type(upstream).__name__}")
        initial = -(-parse_size(initial_size, "initial_size") // _GRAIN) * _GRAIN
        self.maximum_size = None if maximum_size is None else parse_size(maximum_size, "maximum_size")
        if self.maximum_size is not None and initial > self.maximum_size:
            raise ValueError(f"initial_size {initial} exceeds maximum_size {self.maximum_size}")
        if not growth_factor >= 0:
            raise ValueError(f"growth_factor must be >= 0, got {growth_factor}")
        self.upstream = upstream
        self.driver = driver or getattr(upstream, "driver", None)
        self.device_id = upstream.device_id
        self.growth_factor = float(growth_factor)
        self.min_chunk = -(-parse_size(min_chunk, "min_chunk") // _GRAIN) * _GRAIN
        self._lock = threading.Lock()
        self._live: dict[int, int] = {}
        self._aligned: dict[int, tuple[int, int, int]] = {}
        self._states: dict[int, _StreamState] = {}
        self._chunks: dict[int, int] = {}  # chunk base -> size
        self._boundaries: set[int] = set()  # chunk bases: blocks never coalesce across them
        self._held = 0
        self._event = None
        # Host-only memory is not stream ordered: one shared free list for every stream (the hot
        # paths look states up by stream id; for these pools every id finds the one state).
        self._ordered = self.device_accessible  # the upstream's, unless a subclass says otherwise
        if not self._ordered:
            self._states = _OneState()
        a, d = _hot_paths(self)
        _ALLOCATE.__set__(self, a)  # into the slots even when a subclass overrides the methods
        _DEALLOCATE.__set__(self, d)  # (its override wins; super().allocate reaches these)
        if initial:
            with self._lock:
                st = self._state(DEFAULT_STREAM)
                ptr = self._grow(initial, DEFAULT_STREAM, exact=True)
                st.free.insert(ptr, initial, self._boundaries)

    # -- properties -------------------------------------------------------------------------
    @property
    def device_accessible(self) -> bool:
        return self.upstream.device_accessible

    @property
    def host_accessible(self) -> bool:
        return self.upstream.host_accessible

    max_alignment = 1 << 20

    @property
    def pool_size(self) -> int:
        """Bytes currently held from the upstream."""
        return self._held

    @property
    def live_bytes(self) -> int:
        """Bytes handed out (as requested, before rounding) and not yet returned."""
        with self._lock:
            return self._live_total()

    def _live_total(self) -> int:
        return sum(self._live.values()) + sum(n for _, _, n in self._aligned.values())

    @property
    def free_bytes(self) -> int:
        """Bytes held from the upstream and free in some stream's lists."""
        with self._lock:
            return sum(st.bytes() for st in self._states.values())

    # -- slow paths -------------------------------------------------------------------------
    def _as_stream(self, stream) -> Stream:
        if not self._ordered:
            check_stream(stream)
            return DEFAULT_STREAM
        return as_stream(stream, self.driver)

    def _allocate_slow(self, nbytes, stream, alignment):
        nbytes = check_request(nbytes, alignment, self.max_alignment)
        if nbytes == 0:
            return 0
        if alignment <= 256:
            return self.allocate(nbytes, stream)
        size = (nbytes + alignment - _GRAIN + 255) & -256
        with self._lock:
            block = self._take(size, stream, self._states.get(stream.uid if self._ordered else 0))
            ptr = block + (-block % alignment)
            self._aligned[ptr] = (block, size, nbytes)
            return ptr

    def _deallocate_slow(self, ptr, nbytes, stream, alignment):
        if ptr == 0 and nbytes == 0:
            return
        entry = self._aligned.get(ptr)
        if entry is None:
            size = self._live.get(ptr)
            if size is None:
                raise ValueError(f"ptr {ptr:#x} was not allocated by {self!r} or was already freed")
            if size != nbytes:
                raise ValueError(f"nbytes {nbytes} does not match the allocation of {size} bytes at {ptr:#x}")
            # an alignment > 256 was passed for a block allocated without it: treat as normal
            del self._live[ptr]
            block, size = ptr, (nbytes + 255) & -256
        else:
            block, size, n = entry
            if n != nbytes:
                raise ValueError(f"nbytes {nbytes} does not match the allocation of {n} bytes at {ptr:#x}")
            del self._aligned[ptr]
        self._cache_block(block, size, stream)

    def _cache_block(self, block: int, size: int, stream: Stream) -> None:
        """Put a freed block in its stream's exact-size cache (lock held)."""
        st = self._state(stream)
        new = [block]
        lst = st.cache.setdefault(size, new)  # never overwrite: a lock-free free may have added the key
        if lst is not new:
            lst.append(block)

    def _rescue(self, lst: list, size: int, stream: Stream) -> None:
        """Re-home blocks appended to a cache list that is no longer in use (lock held)."""
        for p in _drain(lst):
            self._cache_block(p, size, stream)

    def _state(self, stream: Stream) -> _StreamState:
        uid = stream.uid if self._ordered else 0
        st = self._states.get(uid)
        if st is None:
            st = self._states[uid] = _StreamState(stream)
        return st

    def _fit(self, st: _StreamState, size: int) -> int | None:
        """Take ``size`` bytes from ``st``'s free list (best fit), or None."""
        return st.free.take(size)

    def _take(self, size: int, stream: Stream, st: _StreamState | None) -> int:
        """Find ``size`` bytes for ``stream`` (lock held)."""
        if st is None:
            st = self._state(stream)
        ptr = self._fit(st, size)
        if ptr is not None:
            return ptr
        if st.cache:
            st.flush(self._boundaries)
            ptr = self._fit(st, size)
            if ptr is not None:
                return ptr
        if self._ordered and self._steal(size, st):
            ptr = self._fit(st, size)
            if ptr is not None:
                return ptr
        try:
            chunk = self._grow(size, stream)
        except OutOfMemoryError as first:
            ptr = self._reclaim_and_retry(size, stream, st, first)
            return ptr
        st.free.insert(chunk, self._chunks[chunk], self._boundaries)
        return st.free.take(size)

    def _alive(self, s: Stream):
        """True/False when mrkit knows whether stream ``s`` still exists, None when it cannot."""
        if s.uid < 0:
            return True
        if s._owning:
            return not s._closed
        ref = s._owner_ref
        if isinstance(ref, weakref.ref):
            return ref() is not None
        return None

    def _order_after(self, src: Stream, dst: Stream) -> None:
        drv = self.driver or get_driver()
        if self._alive(src):
            if self._event is None:
                self._event = drv.event_create(self.device_id or 0)
            drv.event_record(self._event, src.handle)
            drv.stream_wait_event(dst.handle, self._event)
        else:
            drv.ctx_synchronize(self.device_id or 0)

    def _steal(self, size: int, st: _StreamState) -> bool:
        """Take over other streams' free memory so that ``st`` can serve ``size``: the whole list of
        one stream whose largest block fits, else — when together they hold enough — every other
        stream's list (coalescing may then make a fit). One event per stream taken over."""
        others = []
        for uid, other in list(self._states.items()):
            if other is st or other.empty():
                continue
            if other.cache:
                other.flush(self._boundaries)
            if other.free.largest() >= size:
                self._take_over(uid, other, st)
                return True
            others.append((uid, other))
        if others and sum(o.free.total() for _, o in others) >= size:
            for uid, other in others:
                self._take_over(uid, other, st)
            return True
        return False

    def _take_over(self, uid: int, other: _StreamState, st: _StreamState) -> None:
        self._order_after(other.stream, st.stream)
        self._merge(other, st)
        if self._alive(other.stream) is not True:
            del self._states[uid]

    def _merge(self, src: _StreamState, dst: _StreamState) -> None:
        """Move all of ``src``'s free memory to ``dst`` (the caller has ordered dst after src).
        The smaller list is inserted into the larger one, so a hand-over to a stream with nothing
        free is O(1) and ping-pong between streams does not re-sort whole lists."""
        b = self._boundaries
        src.flush(b)
        dst.flush(b)
        big, small = (src.free, dst.free) if len(src.free.sizes) > len(dst.free.sizes) else (dst.free, src.free)
        for size, ptr in small.sizes:
            big.insert(ptr, size, b)
        dst.free = big
        src.free = _FreeList()

    def _grow(self, size: int, stream: Stream, exact: bool = False) -> int:
        want = size if exact else max(size, self.min_chunk, int(self._held * self.growth_factor) & -256)
        if self.maximum_size is not None:
            room = self.maximum_size - self._held
            if size > room:
                raise OutOfMemoryError(
                    f"{self!r} cannot allocate {size} bytes ({format_size(size)}): it would exceed its "
                    f"maximum_size of {self.maximum_size} bytes (holding {self._held})", size, self)
            want = min(want, room)
        try:
            ptr = self.upstream.allocate(want, stream)
        except OutOfMemoryError:
            if want == size:
                raise
            want = size
            ptr = self.upstream.allocate(want, stream)
        self._chunks[ptr] = want
        self._boundaries.add(ptr)
        self._held += want
        return ptr

    def _quiesce(self, into: _StreamState, own: bool = False) -> None:
        """Wait for the work of every stream holding free memory (``into``'s own stream too when
        ``own``), then move all free memory to ``into`` (lock held). Only those streams are
        synchronised; streams mrkit cannot prove alive are covered by one device synchronise."""
        if not self._ordered or self.driver is None:
            return
        drv, dev = self.driver, self.device_id or 0
        others = [(uid, st) for uid, st in self._states.items() if st is not into]
        device_wide = False
        for _, st in others + ([(None, into)] if own else []):
            if st.empty():
                continue
            if self._alive(st.stream) is True:
                self._wait_for(st.stream)
            else:
                device_wide = True
        if device_wide:
            drv.ctx_synchronize(dev)
        for uid, st in others:
            self._merge(st, into)
            del self._states[uid]

    def _wait_for(self, stream: Stream) -> None:
        """Synchronise ``stream`` (one mrkit knows to be alive)."""
        if stream.uid < 0:
            self.driver.ensure_context(self.device_id or 0)  # the default streams are the current context's
        self.driver.stream_synchronize(stream.handle)

    def _reclaim_and_retry(self, size, stream, st, first: OutOfMemoryError) -> int:
        """Upstream refused: pool everything, return idle chunks, retry once."""
        self._quiesce(st)
        st.flush(self._boundaries)
        ptr = st.free.take(size)
        if ptr is not None:
            return ptr
        self._release_free_chunks(st)
        try:
            chunk = self._grow(size, stream, exact=True)
        except OutOfMemoryError as exc:
            raise OutOfMemoryError(
                f"{self!r} could not allocate {size} bytes ({format_size(size)}) on {stream!r}: it holds "
                f"{self._held} bytes from upstream in {len(self._chunks)} chunks with "
                f"{sum(s.bytes() for s in self._states.values())} free; upstream said: {exc}",
                size, self) from None
        st.free.insert(chunk, self._chunks[chunk], self._boundaries)
        return st.free.take(size)

    def _release_free_chunks(self, st: _StreamState) -> int:
        """Give back every chunk that is one whole free block of ``st`` (lock held)."""
        released = 0
        for size, ptr in list(st.free.sizes):
            if self._chunks.get(ptr) == size:
                st.free._remove(ptr, size)
                try:
                    self.upstream.deallocate(ptr, size, st.stream if self._ordered else DEFAULT_STREAM)
                except CUDAError:
                    st.free._add(ptr, size)
                    raise
                del self._chunks[ptr]
                self._boundaries.discard(ptr)
                self._held -= size
                released += size
        return released

    def release(self) -> int:
        """Give every wholly free chunk back to the upstream; returns the bytes released.

        First waits for the streams that hold free memory (not the whole device, unless a stream
        may no longer exist), then pools their free lists on the default stream, so a chunk whose
        pieces were freed on different streams coalesces whole again and can be returned.
        """
        with self._lock:
            if any(u != DEFAULT_STREAM.uid for u in self._states):
                self._quiesce(self._state(DEFAULT_STREAM))
            released = 0
            for st in list(self._states.values()):
                st.flush(self._boundaries)
                released += self._release_free_chunks(st)
            return released

    trim = release

    def close(self) -> None:
        """Release everything; raises ``ValueError`` if allocations are still live."""
        with self._lock:
            if self._live or self._aligned:
                raise ValueError(f"{self!r} still has {len(self._live) + len(self._aligned)} live allocations")
        self.release()
        if self._event is not None and self.driver is not None:
            self.driver.event_destroy(self._event)
            self._event = None

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return id(self)

    def _describe(self) -> str:
        lim = "" if self.maximum_size is None else f", maximum_size={self.maximum_size}"
        return f"{self.upstream!r}{lim}"


_ALLOCATE = PoolResource.__dict__["allocate"]
_DEALLOCATE = PoolResource.__dict__["deallocate"]


def fused_paths(upstream, variant: str, **names):
    """``(allocate, deallocate)`` of ``upstream`` in ``variant`` (see :func:`_hot_paths`), or ``None``
    when ``upstream`` is not a pool whose hot path is the stock one."""
    cls = type(upstream)
    if getattr(cls, "allocate", None) is _ALLOCATE and getattr(cls, "deallocate", None) is _DEALLOCATE:
        return _hot_paths(upstream, variant, **names)
    return None
