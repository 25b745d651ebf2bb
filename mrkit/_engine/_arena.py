"""The stream-ordered arena every caching resource shares, and the chunk-source interface.

See ``docs/design.md`` ("The engine") for the locking rules this module follows; each rule is
cited where the code relies on it.
"""
from __future__ import annotations

import functools
import threading
import weakref
from bisect import bisect_left, insort

from .._errors import CUDAError, OutOfMemoryError
from .._resource import check_pointer, check_request, closed_resource, size_mismatch, unknown_pointer
from .._sizes import format_size
from .._stream import DEFAULT_STREAM, Stream, as_stream, check_stream, device_scope
from ..driver import Driver, get_driver
from ._freelist import FreeList, drain
from ._core import paths as _paths

__all__ = ["Arena", "ChunkSource", "StreamState", "GRAIN"]

GRAIN = 256  # every block size and offset is a multiple of this
MAX_HOT = 1024  # cached sizes per stream; past this the cache starts afresh
_CACHE_WINDOW = 8  # larger hot sizes a miss looks at before the free list's best fit
_MISSED_MAX = 4096  # sizes remembered as having missed once
HOT_DISTANCE = 1024  # a size that misses again within this many misses gets a cache list (the default of
# ChunkSource.hot_distance: a loop over up to MAX_HOT sizes, e.g. a batch of 1 000, settles on the cache)
HOT_REPEATS = 2  # ... when it has done so this many times in a row (ChunkSource.hot_repeats): on random
# sizes a size comes back within the distance now and then by chance, and a cache list for it only kept
# its blocks from coalescing (RMM's random workload to 8 MiB, compiled: 10-13 % faster, tools/ab_random.py)


class _StateMethods:
    """What a stream's state does; its fields are :class:`StreamState`'s (the Python build) or the
    compiled build's ``StateFields`` (C struct fields, the same names)."""

    __slots__ = ()

    def register(self, size: int, boundaries) -> None:
        """Give ``size`` a cache list (lock held). Past ``MAX_HOT`` sizes the cache starts afresh."""
        cache = self.cache
        if cache is None or size in cache:
            return
        self.rehot.discard(size)
        if len(self.hot) >= MAX_HOT:
            self.flush(boundaries)
            cache = self.cache
        cache[size] = []
        insort(self.hot, size)

    def flush(self, boundaries, keep: bool = False, remember: bool = False) -> None:
        """Coalesce the cached blocks into the free list and start the cache afresh (lock held): the
        sizes are registered again as they miss (cheaply: they missed recently), so a flush costs
        what was registered since the last one, not every size ever hot. ``keep``: the hot sizes
        keep their (now empty) cache lists. ``remember``: they lose them, but each is hot again at
        its next free (:meth:`hot_again`), without missing twice more.

        Rule 3: the dict is swapped first, then each list is drained with atomic pops, so every block
        is taken by exactly one party; a block appended to a list after it was drained is rescued by
        the deallocating thread, which sees that ``self.cache`` changed."""
        old = self.cache
        if not old:  # empty, or retired
            return
        if remember and not keep:
            if len(self.rehot) + len(self.hot) > MAX_HOT:
                self.rehot.clear()
            self.rehot.update(self.hot)
        if keep:
            self.cache = {s: [] for s in old}
        else:
            self.cache, self.hot = {}, []
        self._drain(old, boundaries)

    def hot_again(self, size: int, boundaries) -> list | None:
        """The cache list of ``size`` if it was hot before a remembering flush (lock held), else
        None."""
        if size not in self.rehot:
            return None
        self.register(size, boundaries)
        return self.cache.get(size)

    def retire(self, boundaries) -> None:
        """Detach the cache for good (lock held): ``cache`` becomes ``None`` first, then the old one is
        drained into the free list."""
        old, self.cache = self.cache, None
        self.hot = []
        self.rehot = set()
        if old:
            self._drain(old, boundaries)

    def _drain(self, old: dict, boundaries) -> None:
        free = self.free
        for size, ptrs in old.items():  # only the lock adds keys
            if ptrs:
                free.insert_drained(ptrs, size, boundaries)

    def take_cached(self, size: int, boundaries) -> int | None:
        """A cached block of a hot size ``>= size`` that fits better than the free list's best, split
        to ``size`` (the rest coalesces into the free list); None if there is none (lock held). Only
        the next ``_CACHE_WINDOW`` hot sizes are looked at."""
        hot = self.hot
        j = bisect_left(hot, size)
        if j == len(hot):
            return None
        free = self.free
        best = free.fits(size) or 1 << 62
        cache = self.cache
        for s in hot[j:j + _CACHE_WINDOW]:
            if s >= best:
                return None
            lst = cache.get(s)
            if lst:
                try:
                    ptr = lst.pop()
                except IndexError:  # a lock-free hit took the last one
                    continue
                if s > size:
                    free.insert(ptr + size, s - size, boundaries)
                return ptr
        return None

    def best_fit(self, size: int, boundaries, spare: int | None = None) -> int | None:
        """Take ``size`` bytes by best fit over all of this stream's free memory (lock held), or None.

        A cached block of a larger hot size serves the request when it fits better than the free
        list's best (:meth:`take_cached`), so a larger block is not split needlessly while a closer
        one sits in the cache (splitting on the free list alone fragmented the pool into running out
        of memory at 95 % of the device). ``spare``: see :meth:`FreeList.take`."""
        if self.hot:
            ptr = self.take_cached(size, boundaries)
            if ptr is not None:
                return ptr
        return self.free.take(size, spare)

    def empty(self) -> bool:
        return not self.free and not self.cached()

    def bytes(self) -> int:
        cache = self.cache or {}
        return self.free.total() + sum(s * len(v) for s, v in cache.items())  # under the lock

    def cached(self) -> bool:
        """Whether any block is in the cache (lock held)."""
        cache = self.cache
        return bool(cache) and any(cache.values())  # only the lock adds keys


class StreamState(_StateMethods):
    """Free memory owned by one stream: ``cache`` (exact size -> list of blocks; the lock-free fast
    path), ``hot`` (the cache's sizes, sorted) and ``free`` (a coalesced :class:`FreeList`, touched
    only under the lock).

    Only *hot* sizes are cached: a size gets a cache list (:meth:`register`, under the lock) when it
    misses the cache a second time; a block of any other size coalesces into the free list when it is
    freed. A workload that repeats its sizes (pairs, a training step) runs lock-free on the cache; one
    whose sizes do not repeat (random sizes) pays one best fit per allocation and one coalescing
    insert per free, with nothing left in a cache to fragment the free list.

    ``cache`` is ``None`` once the state is retired: a lock-free path that finds ``None`` takes the
    locked path instead (rule 4)."""

    __slots__ = ("stream", "cache", "hot", "free", "rehot", "maybe_cached")

    def __init__(self, stream: Stream, free: FreeList) -> None:
        self.stream = stream
        self.maybe_cached = False  # the compiled build's hint (its StateFields.cached); unread here
        self.cache: dict[int, list[int]] | None = {}
        self.hot: list[int] = []
        self.free = free  # an empty free list of the arena's build
        self.rehot: set[int] = set()  # sizes hot before a flush that served a miss (Arena.find)


@functools.cache
def _state_class(build):
    """The state class of a build: :class:`StreamState`, or ``_StateMethods`` over the compiled
    build's ``StateFields``."""
    fields = getattr(build, "StateFields", None)
    if fields is None:
        return StreamState
    return type("StreamState", (fields, _StateMethods),
                {"__slots__": (), "__doc__": StreamState.__doc__, "__module__": __name__})


class _OneState(dict):
    """The states of an arena that is not stream ordered: every stream id finds the one state."""

    def get(self, key, default=None):
        return dict.get(self, 0, default)


class ChunkSource:
    """Where an arena's memory comes from. A caching resource is an :class:`Arena` plus one of these.

    Every hook is called with the arena's lock held and may call the arena's ``*_locked`` helpers
    (never its public, locking methods). Hooks may raise; the arena's state is then unchanged
    (the hook itself must undo what it did, see :meth:`prepare`).

    * :meth:`grow` — new memory: an upstream allocation (pool) or a carved virtual range (VMM).
    * :meth:`fit` — placement: which free block serves a request (default: best fit).
    * :meth:`prepare` — make a block usable before it is handed out (VMM: map missing pages).
    * :meth:`give_back` — return one wholly free chunk (pool: upstream deallocate).
    * :meth:`take_back_set_aside` — out of memory: memory the source set aside (in no free list)
      returns to the free lists before the reclaim pools them.
    * :meth:`trim_upstream` — out of memory even after giving chunks back: let the upstream trim.
    """

    #: whether chunks go back through :meth:`give_back` on release and on the out-of-memory reclaim
    returns_chunks = True
    #: whether :meth:`prepare` does anything (the arena skips the call when not)
    prepares = False
    #: a size that misses again within this many misses, ``hot_repeats`` times in a row, gets a cache
    #: list (see Arena.take)
    hot_distance = HOT_DISTANCE
    hot_repeats = HOT_REPEATS
    #: sizes of at most this many bytes are judged by :data:`HOT_DISTANCE` whatever ``hot_distance``
    #: says (0: none): a source that keeps its distance short for large sizes still caches a loop over
    #: many small ones
    hot_small = 0

    def grow(self, arena: "Arena", size: int, stream: Stream, exact: bool) -> tuple[int, int, bool]:
        """At least ``size`` bytes of new memory for ``stream`` (exactly ``size`` when ``exact``):
        ``(ptr, nbytes, boundary)``; ``boundary`` keeps blocks from coalescing across ``ptr``. Raises
        :class:`~mrkit.OutOfMemoryError` when there is none."""
        raise NotImplementedError

    def fit(self, arena: "Arena", st: StreamState, size: int) -> int | None:
        """Take ``size`` bytes from ``st``'s free memory, or None (:meth:`StreamState.best_fit`)."""
        return st.best_fit(size, arena.boundaries)

    def plain_pages(self):
        """``None`` (default), or ``(coverage, base, page)``: a promise that, whenever something is
        live, :meth:`fit` first coalesces the stream's cached blocks (``StreamState.flush``, nothing
        kept) when it has any, then is the plain best fit that keeps the free
        block ending at ``self.top`` (an int attribute: the end of the carved range) for when nothing
        else fits, and :meth:`prepare` changes nothing for a block whose pages ``coverage`` covers
        (page ``i`` is ``[base + i * page, base + (i + 1) * page)``; ``coverage.starts`` is the sorted
        list of the first pages of its ranges, ``coverage.end`` maps each to its end). The compiled
        arena then runs both steps in C and calls :meth:`prepare` only for a block with missing pages
        (the VMM without a footprint limit or automatic release)."""
        return None

    def prepare(self, arena: "Arena", ptr: int, size: int, stream: Stream) -> int:
        """Called for every block the locked path hands out; returns the block to hand out (normally
        ``ptr``). On failure it must put the block back in ``stream``'s free list and raise."""
        return ptr

    def give_back(self, ptr: int, size: int, stream: Stream) -> None:
        """Return the wholly free chunk ``[ptr, ptr + size)`` (freed on ``stream``)."""
        raise NotImplementedError

    def take_back_set_aside(self, arena: "Arena") -> bool:
        """First step of the out-of-memory reclaim: return to the free lists whatever memory the source
        holds aside, in no free list and not live (the VMM's mappings waiting, after a non-blocking
        trim, for their streams' work), waiting for it if need be. True when anything came back."""
        return False

    def trim_upstream(self) -> bool:
        """Last step of the out-of-memory reclaim, after the idle chunks went back: ask the upstream
        to return what it keeps cached (the driver's pool keeps freed memory reserved until a
        synchronise). True when something was asked, so the grow is worth retrying."""
        return False


class Arena:
    """Stream-ordered sub-allocation over a :class:`ChunkSource`: per-stream states (exact-size caches
    and coalesced free lists), the live table, stream hand-over with one event per hand-over, the
    out-of-memory reclaim and release. ``allocate``/``deallocate`` are the lock-free hot path (see
    :mod:`mrkit._engine._hot`); everything else runs under ``lock``.

    ``owner`` is the resource built on this arena (held weakly; it names itself in errors).
    ``ordered=False`` (host memory): one state for every stream, nothing stream ordered."""

    def __init__(self, source: ChunkSource, owner, *, device_id: int | None, driver: Driver | None,
                 ordered: bool) -> None:
        self.source = source
        self._owner = weakref.ref(owner)
        # read once: a request to a resource nobody holds is validated after the owner has gone
        self.max_alignment = owner.max_alignment
        self.device_id = device_id
        self.driver = driver
        self.ordered = ordered
        self.aligned: dict[int, tuple[int, int, int, int]] = {}  # ptr -> (block, size, nbytes, alignment > 256)
        self.states: dict[int, StreamState] = {} if ordered else _OneState()
        self.chunks: dict[int, int] = {}  # chunk base -> size
        self.build = _paths()  # the hot path's build (compiled or Python), kept for its variants
        # ptr -> nbytes as requested: a dict, or the compiled build's AddressTable (the same mapping,
        # its keys C values hashed for addresses)
        self.live: dict[int, int] = self.build.AddressTable() if hasattr(self.build, "AddressTable") else {}
        self.boundaries = self.build.Boundaries()  # chunk bases: blocks never coalesce across them
        self.held = 0
        self.event = None
        self.closed = False  # set by the owner's close(): every allocation reaching find() is refused
        self._prepare = source.prepare if source.prepares else None
        # the default placement and nothing to prepare: the compiled build runs the placement in C too
        self.default_fit = type(source).fit is ChunkSource.fit and self._prepare is None
        # Reentrant for Python code, and it knows its owner; a free that finds it taken is deferred,
        # never waits (rule 8, see free_or_defer). The compiled build's is taken from C (_hotc.Lock).
        self.lock = self.build.Lock() if hasattr(self.build, "Lock") else threading.RLock()
        self.owned = self.lock._is_owned
        self.deferred: list[tuple[int, int, Stream]] = []  # (block, size, stream): see free_or_defer
        self.missed = self.build.Misses(source.hot_distance, _MISSED_MAX, source.hot_repeats,  # see take
                                        source.hot_small, HOT_DISTANCE)
        self._State = _state_class(self.build)
        self.allocate, self.deallocate = self.build.plain_paths(self)

    @property
    def owner(self):
        return self._owner()

    @property
    def misses(self) -> int:
        """How many requests missed the cache (took the locked path) so far."""
        return self.missed.count

    # -- reading --------------------------------------------------------------------------------
    def live_total(self) -> int:
        return sum(list(self.live.values())) + sum(e[2] for e in list(self.aligned.values()))

    def free_total(self) -> int:
        return sum(st.bytes() for st in list(self.states.values())) + sum(d[1] for d in list(self.deferred))

    # -- streams --------------------------------------------------------------------------------
    def as_stream(self, stream) -> Stream:
        if not self.ordered:
            check_stream(stream)
            return DEFAULT_STREAM
        return as_stream(stream, self.driver)

    def state(self, stream: Stream) -> StreamState:
        """The state of ``stream``, made if missing (lock held; rule 5: always looked up afresh)."""
        uid = stream.uid if self.ordered else 0
        st = self.states.get(uid)
        if st is None:
            st = self.states[uid] = self._State(stream, self.build.FreeList())
        return st

    def retire_into(self, uid: int, st: StreamState, into: StreamState) -> None:
        """Retire ``st`` (rule 4: cache detached, then drained, then the state forgotten) and move its
        free memory to ``into`` (the caller has ordered ``into`` after it)."""
        st.retire(self.boundaries)
        if self.states.get(uid) is st:
            del self.states[uid]
        self.merge(st, into)

    def merge(self, src: StreamState, dst: StreamState) -> None:
        """Move ``src``'s free list to ``dst`` (the caller detached ``src``'s cache, then ordered dst
        after src). Never ``src``'s cache: a block freed into it lock-free after the caller detached it
        has work queued on ``src``'s stream that the ordering does not cover, so it stays there
        (rule 7)."""
        if src is dst:
            return
        dst.free = dst.free.absorb(src.free, self.boundaries)
        src.free = self.build.FreeList()

    def order_after(self, src: Stream, dst: Stream) -> None:
        """Make future work on ``dst`` wait for the work queued so far on ``src`` (one event), or
        synchronise the device when ``src`` may no longer exist."""
        drv = self.driver or get_driver()
        with src.hold() as alive:  # src's own thread may close it meanwhile: it waits until the event is recorded
            if alive is not True:
                drv.ctx_synchronize(self.device_id or 0)
                return
            if self.event is None:
                self.event = drv.event_create(self.device_id or 0)
            with device_scope(drv, self.device_id or 0, src, dst):
                drv.event_record(self.event, src.handle)
                drv.stream_wait_event(dst.handle, self.event)

    def wait_for_device(self) -> None:
        """Synchronise the device (when the arena's memory is a driver's)."""
        if self.driver is not None:
            self.driver.ctx_synchronize(self.device_id or 0)

    def wait_for(self, stream: Stream) -> None:
        """Synchronise ``stream`` (one mrkit knew to be alive: if it was closed since, the device)."""
        with stream.hold() as alive:  # held open for the wait
            if alive is not True:
                self.driver.ctx_synchronize(self.device_id or 0)
                return
            with device_scope(self.driver, self.device_id or 0, stream):
                self.driver.stream_synchronize(stream.handle)

    # -- the locked allocation path ---------------------------------------------------------------
    def take(self, size: int, stream: Stream) -> int:
        """Find ``size`` bytes for ``stream`` and make them usable (lock held): a cache miss. The
        stream's own free memory first (the source's :meth:`~ChunkSource.fit`), :meth:`find` only
        when that fails."""
        if self.deferred:  # frees made while the lock was taken: in their lists before the fit
            self.apply_deferred()
        st = self.states.get(stream.uid)
        if st is None:
            ptr = None
        elif self.default_fit:  # ChunkSource.fit, without its frame
            ptr = st.best_fit(size, self.boundaries)
        else:
            ptr = self.source.fit(self, st, size)
        if ptr is None:
            ptr = self.find(size, stream, tried=st is not None)
        prepare = self._prepare
        if prepare is not None:
            ptr = prepare(self, ptr, size, stream)
        if self.missed.note(size):  # the third miss in a row within hot_distance makes the size hot for the
            self.state(stream).register(size, self.boundaries)  # stream: its frees are cached from now on
        if self.deferred:
            self.apply_deferred()
        return ptr

    def free_or_defer(self, block: int, size: int, stream: Stream) -> None:
        """A freed block (no longer live): into its stream's lists under the lock, applying the frees
        deferred meanwhile; or, when the lock is taken, queued in :attr:`deferred` (rule 8: a free
        never waits). Taken by this thread: it is inside a locked step that a finalizer interrupted
        (the garbage collector collected an object that frees memory of this arena, e.g. a CuPy array
        in a reference cycle); waiting would deadlock, and changing the free lists in the middle of that
        step could corrupt them. Taken by another thread: waiting could deadlock too (that thread's own
        finalizer may wait for a lock this one holds), and the holder applies the queue at the start
        and end of its locked steps (:meth:`apply_deferred`). Queuing is one atomic ``append`` (the
        compiled build appends in C). Rule 2: a block is live, in a cache list, in a free list, or
        queued here."""
        lock = self.lock
        if self.owned() or not lock.acquire(False):
            self.deferred.append((block, size, stream))
            return
        try:
            self.free_block(block, size, stream)
            if self.deferred:
                self.apply_deferred()
        finally:
            lock.release()

    def free_slow(self, ptr, nbytes, stream: Stream, alignment) -> None:
        """A free the lock-free path did not accept (zero, aligned blocks, errors): checked and taken
        out of the live tables (:meth:`unlive`: a bad free raises, changing nothing), then freed or
        deferred (:meth:`free_or_defer`)."""
        got = self.unlive(ptr, nbytes, alignment)
        if got is not None:
            self.free_or_defer(got[0], got[1], stream)

    def apply_deferred(self) -> None:
        """Put the deferred frees in their free lists or caches (lock held: at the start and end of the
        locked steps that place or return memory)."""
        d = self.deferred
        while d:
            block, size, stream = d.pop()
            self.free_block(block, size, stream)

    def nested_allocation(self, nbytes) -> None:
        """An allocation while this thread holds the lock (a finalizer that allocates, run inside a
        locked step) cannot be served: raises RuntimeError."""
        raise RuntimeError(
            f"{self.owner!r} cannot allocate {nbytes} bytes here: this thread is inside one of its locked "
            f"steps (a finalizer, run by the garbage collector there, allocated)")

    def find(self, size: int, stream: Stream, tried: bool = False) -> int:
        """``size`` bytes for ``stream`` (lock held): its own free memory (unless ``tried`` already),
        other streams' free memory (after ordering), new memory from the source, then the
        out-of-memory reclaim. A stream mrkit knows is gone is refused here, before anything changes:
        each of those steps may hand its handle to the driver (the stream's own free memory may still
        be handed out on it, with no driver call)."""
        if self.closed:  # nothing is held once closed: every allocation misses and arrives here
            raise closed_resource(self.owner)
        stream._live()  # ValueError once mrkit knows it is gone
        st = self.state(stream)
        fit = self.source.fit
        if not tried:
            ptr = fit(self, st, size)
            if ptr is not None:
                return ptr
        if st.cached():
            # the cache coalesces to serve this miss; its sizes are hot again at their next free, so a
            # loop that outgrows the pool settles on the cache on its next pass
            st.flush(self.boundaries, remember=True)
            ptr = fit(self, st, size)
            if ptr is not None:
                return ptr
        if self.ordered and self.steal(size, st):
            ptr = fit(self, st, size)
            if ptr is not None:
                return ptr
        try:
            chunk, n = self.grow(size, stream)
        except OutOfMemoryError as first:
            return self.reclaim_and_retry(size, stream, st, first)
        st.free.insert(chunk, n, self.boundaries)
        return st.free.take(size)

    def grow(self, size: int, stream: Stream, exact: bool = False) -> tuple[int, int]:
        ptr, n, boundary = self.source.grow(self, size, stream, exact)
        self.chunks[ptr] = n
        if boundary:
            self.boundaries.add(ptr)
        self.held += n
        return ptr, n

    def steal(self, size: int, st: StreamState) -> bool:
        """Take over other streams' free memory so that ``st`` can serve ``size``: the whole list of
        one stream whose largest block fits, else — when together they hold enough — every other
        stream's list (coalescing may then make a fit). One event per stream taken over."""
        others = []
        for uid, other in list(self.states.items()):
            if other is st or other.empty():
                continue
            other.flush(self.boundaries)
            if other.free.largest() >= size:
                self.take_over(uid, other, st)
                return True
            others.append((uid, other))
        if others and sum(o.free.total() for _, o in others) >= size:
            for uid, other in others:
                self.take_over(uid, other, st)
            return True
        return False

    def take_over(self, uid: int, other: StreamState, st: StreamState) -> None:
        """Move ``other``'s free list to ``st`` behind one event (its cache was flushed by the caller;
        a state mrkit cannot prove alive is retired first). Rule 7: detached, then ordered, then moved."""
        alive = other.stream.alive is True
        if not alive:
            other.retire(self.boundaries)
        self.order_after(other.stream, st.stream)
        if alive:
            self.merge(other, st)  # rule 4: a live stream keeps its state
        else:
            self.retire_into(uid, other, st)

    def quiesce(self, into: StreamState, own: bool = False) -> None:
        """Wait for the work of every stream holding free memory (``into``'s own stream too when
        ``own``), then move all free memory to ``into`` (lock held). Only those streams are
        synchronised; streams mrkit cannot prove alive are covered by one device synchronise, and
        their states retired."""
        if not self.ordered or self.driver is None:
            return
        b = self.boundaries
        others = [(uid, st, st.stream.alive is True) for uid, st in list(self.states.items()) if st is not into]
        # rule 7: every cache is detached before the wait, so a block freed lock-free from now on
        # stays with its stream (its work is not waited for) instead of being moved with the rest
        for _, st, alive in others:
            if alive:
                st.flush(b)
            else:
                st.retire(b)
        if own:
            into.flush(b)
        device_wide = False
        for st, alive in [(st, alive) for _, st, alive in others] + ([(into, True)] if own else []):
            if not st.free:
                continue
            if alive:
                self.wait_for(st.stream)
            else:
                device_wide = True
        if device_wide:
            self.driver.ctx_synchronize(self.device_id or 0)
        for uid, st, alive in others:
            if alive:
                self.merge(st, into)
            else:
                self.retire_into(uid, st, into)

    def reclaim_and_retry(self, size: int, stream: Stream, st: StreamState, first: OutOfMemoryError) -> int:
        """The source refused: take back what the source set aside, pool everything, return idle
        chunks, retry once."""
        self.source.take_back_set_aside(self)
        self.quiesce(st)
        st.flush(self.boundaries)
        ptr = st.free.take(size)
        if ptr is not None:
            return ptr
        self.release_free_chunks(st)
        try:
            try:
                chunk, n = self.grow(size, stream, exact=True)
            except OutOfMemoryError:
                if not self.source.trim_upstream():
                    raise
                chunk, n = self.grow(size, stream, exact=True)  # what the upstream kept is free now
        except OutOfMemoryError as exc:
            raise OutOfMemoryError(
                f"{self.owner!r} could not allocate {size} bytes ({format_size(size)}) on {stream!r}: it "
                f"holds {self.held} bytes in {len(self.chunks)} chunks with {self.free_total()} free; "
                f"upstream said: {exc}", size, self.owner) from None
        st.free.insert(chunk, n, self.boundaries)
        return st.free.take(size)

    def release_free_chunks(self, st: StreamState) -> int:
        """Give back every chunk that is one whole free block of ``st`` (lock held)."""
        if not self.source.returns_chunks:
            return 0
        released = 0
        stream = st.stream if self.ordered else DEFAULT_STREAM
        with stream.hold():  # rule 9: another thread's stream, named in the upstream's frees
            for size, ptr in st.free.blocks():
                if self.chunks.get(ptr) == size:
                    st.free.remove(ptr, size)
                    try:
                        self.source.give_back(ptr, size, stream)
                    except CUDAError:
                        st.free.add(ptr, size)
                        raise
                    del self.chunks[ptr]
                    self.boundaries.discard(ptr)
                    self.held -= size
                    released += size
        return released

    def release(self) -> int:
        """Give every wholly free chunk back to the source; returns the bytes released. First waits
        for the streams that hold free memory and pools their free lists on the default stream, so a
        chunk whose pieces were freed on different streams coalesces whole again."""
        with self.lock:
            self.apply_deferred()
            if any(u != DEFAULT_STREAM.uid for u in self.states):
                self.quiesce(self.state(DEFAULT_STREAM))
            released = 0
            for st in list(self.states.values()):
                st.flush(self.boundaries)
                released += self.release_free_chunks(st)
            self.apply_deferred()  # frees a finalizer made meanwhile (their chunks go at the next release)
            return released

    # -- slow paths of the hot path -----------------------------------------------------------------
    def allocate_slow(self, nbytes, stream: Stream, alignment) -> int:
        """Everything the fast path does not handle: sizes that are not plain positive ints, zero,
        and alignments above 256. Validation happens before any state changes."""
        nbytes = check_request(nbytes, alignment, self.max_alignment)
        if nbytes == 0:
            return 0
        if alignment <= GRAIN:
            return self.allocate(nbytes, stream)
        size = (nbytes + alignment - GRAIN + 255) & -256
        if self.owned():
            self.nested_allocation(nbytes)
        with self.lock:
            block = self.take(size, stream)
            ptr = block + (-block % alignment)
            self.aligned[ptr] = (block, size, nbytes, alignment)
            return ptr

    def unlive(self, ptr, nbytes, alignment) -> tuple[int, int] | None:
        """Check a free the fast path did not accept and take its block out of the live tables:
        ``(block, size)`` to free, or None for the free of nothing (``0, 0``). A bad free raises
        ValueError and changes nothing. Atomic dict operations (taken out, then put back if the free
        is bad, as on the lock-free path), so it needs no lock: two threads freeing one block cannot
        both take it."""
        ptr = check_pointer(ptr)  # an int from here on: a float equal to a live pointer is refused, and
        if ptr == 0 and nbytes == 0:  # a NumPy int is never cached (and handed out again) as itself
            return None
        entry = self.aligned.pop(ptr, None)
        if entry is None:
            size = self.live.pop(ptr, None)
            if size is None:
                raise unknown_pointer(ptr, self.owner)
            if size != nbytes or alignment > GRAIN:
                self.live[ptr] = size
                if size != nbytes:
                    raise size_mismatch(nbytes, size, ptr)
                raise ValueError(f"alignment {alignment} does not match the allocation at {ptr:#x} "
                                 f"(made with an alignment of at most {GRAIN})")
            return ptr, (nbytes + 255) & -256
        block, size, n, align = entry
        if n != nbytes or alignment != align:
            self.aligned[ptr] = entry
            if n != nbytes:
                raise size_mismatch(nbytes, n, ptr)
            raise ValueError(f"alignment {alignment} does not match the allocation at {ptr:#x} "
                             f"(made with alignment {align})")
        return block, size

    def free_block(self, block: int, size: int, stream: Stream) -> None:
        """A freed block (lock held): into its stream's cache when the size is hot, else coalesced
        into its free list."""
        st = self.state(stream)  # a state in the table is never retired (rule 4)
        lst = st.cache.get(size)
        if lst is None:
            lst = st.hot_again(size, self.boundaries)
        if lst is None:
            st.free.insert(block, size, self.boundaries)
        else:
            lst.append(block)
            st.maybe_cached = True

    def rescue(self, lst: list, size: int, stream: Stream) -> None:
        """Re-home blocks appended to a cache list that is no longer attached (rule 3): each freed or
        deferred (:meth:`free_or_defer`; the caller need not hold the lock)."""
        for p in drain(lst):
            self.free_or_defer(p, size, stream)

    def close_event(self) -> None:
        if self.event is not None and self.driver is not None:
            self.driver.event_destroy(self.event)
            self.event = None
