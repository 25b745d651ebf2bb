"""``VirtualMemoryResource``: one large virtual reservation, physical pages mapped on demand and
given back when free."""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from .._errors import OutOfMemoryError
from .._sizes import format_size, parse_size
from .._stream import DEFAULT_STREAM, Stream
from ..driver import Driver, get_driver
from ..suballoc._pool import PoolResource, _FreeList
from ._basic import HostMemoryResource

__all__ = ["VirtualMemoryResource", "VirtualMemoryResourceOptions"]


@dataclass(frozen=True)
class VirtualMemoryResourceOptions:
    """reserve_size: virtual bytes reserved once (default: twice the device's memory).
    page_size: the unit of physical memory, a multiple of the allocation granularity (default: the
        granularity).
    max_mapping: the largest single mapping (one ``cuMemCreate`` + ``cuMemMap``); a block's missing
        pages are mapped in runs of up to this size, and a run is released only when all of it is free.
        Larger runs mean fewer driver calls; smaller ones a tighter footprint.
    release_threshold: free mapped bytes tolerated before free runs are unmapped and released
        automatically (``None``: no absolute limit).
    release_fraction: the same, relative to the live bytes (``0.1``: keep the free mapped memory under
        10 % of what is live). With neither, memory goes back only on :meth:`VirtualMemoryResource.trim`.
    peers: devices given read-write access to every mapping (``cuMemSetAccess``)."""

    reserve_size: int | str | None = None
    page_size: int | str | None = None
    max_mapping: int | str = "64 MiB"
    release_threshold: int | str | None = None
    release_fraction: float | None = None
    peers: tuple = ()

    def __post_init__(self):
        for f in ("reserve_size", "page_size", "release_threshold"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, parse_size(v, f))
        object.__setattr__(self, "max_mapping", parse_size(self.max_mapping, "max_mapping"))
        if self.release_fraction is not None and not self.release_fraction >= 0:
            raise ValueError(f"release_fraction must be >= 0, got {self.release_fraction}")
        object.__setattr__(self, "peers", tuple(self.peers))


class VirtualMemoryResource(PoolResource):
    """Device memory on the CUDA virtual memory management API.

    One virtual range is reserved at construction (``cuMemAddressReserve``) and sub-allocated with
    :class:`~mrkit.PoolResource`'s stream-ordered free lists, so growth never copies and never moves a
    live allocation, and neighbouring free blocks always coalesce. Physical memory comes in pages
    (``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``) mapped when a block that needs them is handed
    out, and goes back (``cuMemUnmap`` + ``cuMemRelease``) for every page lying wholly inside free
    memory on :meth:`trim` — or automatically past ``release_threshold``/``release_fraction``.
    Unmapping is not stream-ordered, so :meth:`trim` first waits for the streams that hold free memory
    (the whole device only when one of them may no longer exist).

    Pages are mapped in runs (up to ``max_mapping`` per ``cuMemCreate``/``cuMemMap``), so a 1 GiB
    block costs a handful of driver calls; a run goes back only when all of it is free.

    Invariant: every live block and every block in an exact-size cache is fully mapped; only blocks in
    the coalesced free lists may have unmapped pages, and taking one maps them.

    Undo on failure: mapping a block's pages is one transaction; if any ``cuMemCreate``/``cuMemMap``/
    ``cuMemSetAccess`` fails (out of memory half-way, say) the pages mapped by that call are unmapped
    and released, the block returns to the free list, and the pool first trims itself and retries.
    """

    __slots__ = ("options", "page", "base", "reserve_size", "_top", "_maps", "_owner", "_mapped",
                 "_mapped_high", "_peers", "_run_pages", "_pending")

    def __init__(self, device: int = 0, options: VirtualMemoryResourceOptions | None = None, *,
                 driver: Driver | None = None) -> None:
        opts = options or VirtualMemoryResourceOptions()
        drv = driver or get_driver()
        if not drv.device_capability(device, "virtual_memory_management_supported"):
            raise ValueError(f"device {device} does not support virtual memory management")
        gran = drv.mem_get_allocation_granularity(device)
        page = opts.page_size or gran
        if page % gran:
            raise ValueError(f"page_size {page} must be a multiple of the allocation granularity {gran}")
        reserve = opts.reserve_size or 2 * drv.device_total_mem(device)
        reserve = -(-reserve // page) * page
        # The pool machinery needs an upstream only for its properties; chunks come from _grow below.
        super().__init__(HostMemoryResource(), min_chunk=page, growth_factor=0.0, driver=drv)
        self._ordered = True
        self._states = {}
        self.device_id = device
        self.options, self.page, self.reserve_size = opts, page, reserve
        self._peers = opts.peers
        self.base = drv.mem_address_reserve(reserve, page)
        self._top = self.base
        self._boundaries.add(self.base)
        self._maps: dict[int, tuple[int, int]] = {}  # first page of a run -> (pages, handle)
        self._owner: dict[int, int] = {}  # page index -> first page of the run mapping it
        self._mapped = 0
        self._mapped_high = 0
        self._run_pages = max(1, opts.max_mapping // page)
        self._pending: list = []  # (event, stream, runs) set aside by a non-blocking release

    # -- properties ---------------------------------------------------------------------------
    device_accessible = True
    host_accessible = False

    @property
    def mapped_bytes(self) -> int:
        """Physical bytes mapped now."""
        return self._mapped

    @property
    def mapped_high(self) -> int:
        """Highest ``mapped_bytes`` since construction (or :meth:`reset_mapped_high`)."""
        return self._mapped_high

    def reset_mapped_high(self) -> None:
        self._mapped_high = self.mapped_bytes

    @property
    def reserved_bytes(self) -> int:
        """Virtual bytes reserved."""
        return self.reserve_size

    # -- growth: carve more of the reservation (virtual only) ------------------------------
    def _grow(self, size: int, stream: Stream, exact: bool = False) -> int:
        want = -(-size // self.page) * self.page
        if self._top + want > self.base + self.reserve_size:
            raise OutOfMemoryError(
                f"{self!r} cannot allocate {size} bytes ({format_size(size)}): its {format_size(self.reserve_size)} "
                f"virtual reservation is exhausted", size, self)
        ptr = self._top
        self._top += want
        self._chunks[ptr] = want
        self._held += want
        return ptr

    def _release_free_chunks(self, st) -> int:
        return 0  # the virtual range is kept; physical pages go back through trim()

    # -- mapping --------------------------------------------------------------------------------
    def _take(self, size, stream, st):
        ptr = super()._take(size, stream, st)
        try:
            self._ensure_mapped(ptr, size)
        except OutOfMemoryError:
            self._state(stream).free.insert(ptr, size, self._boundaries)
            self._trim_locked()
            ptr = super()._take(size, stream, self._states.get(stream.uid))
            try:
                self._ensure_mapped(ptr, size)
            except BaseException:
                self._state(stream).free.insert(ptr, size, self._boundaries)
                raise
        except BaseException:
            self._state(stream).free.insert(ptr, size, self._boundaries)
            raise
        opts = self.options
        if opts.release_threshold is not None or opts.release_fraction is not None:
            live = self._live_total()
            free = self._mapped - live - size
            limit = min(opts.release_threshold if opts.release_threshold is not None else free,
                        int(opts.release_fraction * live) if opts.release_fraction is not None else free)
            if free > limit:
                self._release_async()
        return ptr

    def _ensure_mapped(self, ptr: int, size: int) -> None:
        """Map every missing page of [ptr, ptr+size), in runs of up to ``max_mapping``, as one
        transaction: if any step fails, the runs mapped by this call are unmapped and released."""
        drv, dev, page, base = self.driver, self.device_id, self.page, self.base
        first = (ptr - base) // page
        last = (ptr + size - 1 - base) // page
        owner = self._owner
        runs, i = [], first
        while i <= last:
            if i in owner:
                i += 1
                continue
            j = i
            while j + 1 <= last and j + 1 - i < self._run_pages and (j + 1) not in owner:
                j += 1
            runs.append((i, j - i + 1))
            i = j + 1
        done: list[tuple[int, int, int]] = []
        try:
            for start, n in runs:
                va, nbytes = base + start * page, n * page
                h = drv.mem_create(dev, nbytes)
                try:
                    drv.mem_map(va, nbytes, 0, h)
                except BaseException:
                    drv.mem_release(h)
                    raise
                done.append((start, n, h))
                drv.mem_set_access(va, nbytes, dev, "readwrite")
                for peer in self._peers:
                    drv.mem_set_access(va, nbytes, peer, "readwrite")
        except BaseException as exc:
            for start, n, h in reversed(done):
                drv.mem_unmap(base + start * page, n * page)
                drv.mem_release(h)
            if isinstance(exc, OutOfMemoryError):
                raise OutOfMemoryError(
                    f"{self!r} could not map physical memory for {size} bytes ({format_size(size)}): "
                    f"{self._mapped} bytes mapped, {self._live_total()} live; {exc}", size, self) from None
            raise
        for start, n, h in done:
            self._maps[start] = (n, h)
            for k in range(start, start + n):
                owner[k] = start
            self._mapped += n * page
        if self._mapped > self._mapped_high:
            self._mapped_high = self._mapped

    def trim(self, wait: bool = True) -> int:
        """Unmap and release every mapping lying wholly in free memory; returns the bytes released.

        ``wait=True`` first waits for the streams that freed that memory (the whole device only when
        one of them may be gone). ``wait=False`` blocks on nothing: it records one event per stream
        holding free memory, sets those mappings aside, and releases each once its event has completed
        (checked on every later trim and slow-path allocation). A later allocation maps pages again."""
        with self._lock:
            return self._trim_locked() if wait else self._release_async()

    release = trim

    def _runs_in(self, free: _FreeList):
        """The mappings lying wholly inside one free block of ``free``, with that block's start."""
        page, base = self.page, self.base
        starts = sorted(free.start)
        for first, (n, h) in list(self._maps.items()):
            lo, hi = base + first * page, base + (first + n) * page
            k = bisect_right(starts, lo) - 1
            if k >= 0 and starts[k] + free.start[starts[k]] >= hi:
                yield first, n, h, lo, hi, starts[k]

    def _unmap(self, first: int, n: int, h: int) -> int:
        drv, page = self.driver, self.page
        lo = self.base + first * page
        drv.mem_unmap(lo, n * page)
        drv.mem_release(h)
        del self._maps[first]
        for p in range(first, first + n):
            del self._owner[p]
        self._mapped -= n * page
        return n * page

    def _trim_locked(self) -> int:
        home = self._state(DEFAULT_STREAM)
        released = self._drain_pending(wait=True)
        # Unmapping is not stream ordered: wait for the streams that freed the memory first.
        self._quiesce(home, own=True)
        home.flush(self._boundaries)
        for first, n, h, *_ in list(self._runs_in(home.free)):
            released += self._unmap(first, n, h)
        return released

    def _release_async(self) -> int:
        """Set aside the free mappings of every stream behind one event each; release those whose
        events completed. Never blocks (streams mrkit cannot prove alive are left for trim())."""
        released = self._drain_pending(wait=False)
        drv = self.driver
        for st in list(self._states.values()):
            st.flush(self._boundaries)
            if not st.free.sizes or self._alive(st.stream) is not True:
                continue
            runs = list(self._runs_in(st.free))
            if not runs:
                continue
            by_block: dict[int, list] = {}
            for first, n, h, lo, hi, block in runs:
                by_block.setdefault(block, []).append((lo, hi))
            for block, spans in by_block.items():  # carve the runs out: the gaps stay free
                end = block + st.free.start[block]
                st.free._remove(block, end - block)
                cursor = block
                for lo, hi in sorted(spans):
                    if lo > cursor:
                        st.free._add(cursor, lo - cursor)
                    cursor = hi
                if end > cursor:
                    st.free._add(cursor, end - cursor)
            if st.stream.uid < 0:
                drv.ensure_context(self.device_id)
            ev = drv.event_create(self.device_id)
            drv.event_record(ev, st.stream.handle)
            self._pending.append((ev, st.stream, [r[:5] for r in runs]))
        return released + self._drain_pending(wait=False)

    def _drain_pending(self, wait: bool) -> int:
        """Release set-aside mappings whose events completed (all of them when ``wait``); their
        virtual ranges go back to the free list of the stream that gave them up."""
        drv, released, keep = self.driver, 0, []
        for ev, stream, runs in self._pending:
            if wait:
                drv.event_synchronize(ev)
            elif not drv.event_query(ev):
                keep.append((ev, stream, runs))
                continue
            drv.event_destroy(ev)
            st = self._state(stream)
            for first, n, h, lo, hi in runs:
                released += self._unmap(first, n, h)
                st.free.insert(lo, hi - lo, self._boundaries)
        self._pending = keep
        return released

    def close(self) -> None:
        """Release every page and the reservation (all allocations must have been freed)."""
        with self._lock:
            if self._live or self._aligned:
                raise ValueError(f"{self!r} still has {len(self._live) + len(self._aligned)} live allocations")
            self._trim_locked()
            if self.base:
                self.driver.mem_address_free(self.base, self.reserve_size)
                self.base = 0
                self._states.clear()

    def _describe(self) -> str:
        return (f"device={self.device_id}, reserved={format_size(self.reserve_size)}, "
                f"mapped={format_size(self.mapped_bytes)}, driver={self.driver.name}")
