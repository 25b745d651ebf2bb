"""``VirtualMemoryResource``: one large virtual reservation, physical pages mapped on demand and
given back when free."""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

from .._errors import OutOfMemoryError
from .._sizes import format_size, parse_size
from .._resource import check_device, closed_resource, still_live
from .._engine import Arena, CachingResource, ChunkSource, FreeList
from .._stream import DEFAULT_STREAM, Stream, device_scope
from ..driver import VMM_HANDLE_TYPES, Driver, get_driver

__all__ = ["VirtualMemoryResource", "VirtualMemoryResourceOptions"]

# Near a full device a run beside live blocks strands its free pages (a run is released only whole):
# past _NEAR_FULL_FRACTION of the device's memory, or after the device ran out, runs are at most
# _NEAR_FULL_RUN (footprint_limit's 256 MiB runs stranded 7 GiB at 95 % of an H200 and ran out of
# memory where 64 MiB runs finish)
_NEAR_FULL_RUN = 64 << 20
_NEAR_FULL_FRACTION = 0.75
_RUNS_PER_BLOCK = 8  # with a footprint limit: a block's new pages come in runs of 1/8 of it (64 MiB at least)
_PLACEMENT_WINDOW = 8  # with a footprint limit: how many of the smallest fitting free blocks placement weighs


class FootprintLimitError(OutOfMemoryError):
    """A :class:`VirtualMemoryResource` with ``footprint_limit`` refused a request that would take its
    physical memory past the limit's bound (the device itself may have room)."""


@dataclass(frozen=True)
class VirtualMemoryResourceOptions:
    """reserve_size: virtual bytes reserved once (default: twice the device's memory).
    page_size: the unit of physical memory, a multiple of the allocation granularity (default: the
        granularity).
    max_mapping: the largest single mapping (one ``cuMemCreate`` + ``cuMemMap``); a block's missing
        pages are mapped in runs of up to this size, and a run is released only when all of it is free.
        Larger runs mean fewer driver calls; smaller ones a tighter footprint. Default: 64 MiB, or
        256 MiB with ``footprint_limit`` (a move costs about the same whatever its size, so moving
        physical memory in larger pieces makes fewer moves). Past three quarters of the device's
        memory, or once it has run out, runs are at most 64 MiB: a large run partly reused beside a
        live block strands its free pages, and near a full device that is the next out-of-memory.
    release_threshold: free mapped bytes tolerated before free runs are unmapped and released
        automatically (``None``: no absolute limit).
    release_fraction: the same, relative to the live bytes (``0.1``: keep the free mapped memory under
        10 % of what is live). With neither, memory goes back only on :meth:`VirtualMemoryResource.trim`.
    footprint_limit: keep the physical memory held within this factor of the live high-water mark
        (``1.05``: within 5 %) by moving it rather than creating more. A guarantee, on any workload:
        the physical memory the driver holds for the resource never exceeds the high-water mark of
        ``footprint_limit`` x the live bytes (each allocation rounded up to 256 bytes) plus one page
        per live allocation; a request that cannot be served within it is refused with an
        :class:`~mrkit.OutOfMemoryError` naming the limit; no memory is added and no live block
        changes. A block's new pages come in runs of an eighth of the block (at least 64 MiB, at most
        ``max_mapping``), so that a run partly reused beside live blocks strands little. When mapping a
        block's missing pages would exceed the limit, mappings lying wholly in free memory are unmapped
        (after waiting for the streams that freed them) and their physical allocations mapped where they
        are needed
        (``cuMemUnmap``, then ``cuMemMap`` + ``cuMemSetAccess``; no ``cuMemCreate``). Each move is
        driver calls, so this trades time for footprint; ``None`` (default): never move. With a limit,
        placement also looks at what is mapped: of the few smallest free blocks that fit, a block goes
        where the fewest pages are missing (so fewer pages move), and when each of them misses some,
        into a mapped stretch of any free block that holds it.
    peers: devices given read-write access to every mapping (``cuMemSetAccess``).
    location: the device whose memory backs the pages (default: the resource's device); the resource's
        device (and ``peers``) get access to it, so another device's memory needs peer capability.
    handle_type: which shareable handle the physical allocations can be exported as (``cuMemCreate``'s
        requested handle types): ``"none"`` (default), ``"posix_fd"``, ``"win32"`` or ``"fabric"``;
        the granularity is queried for that handle type."""

    reserve_size: int | str | None = None
    page_size: int | str | None = None
    max_mapping: int | str | None = None
    release_threshold: int | str | None = None
    release_fraction: float | None = None
    footprint_limit: float | None = None
    peers: tuple = ()
    location: int | None = None
    handle_type: str = "none"

    def __post_init__(self):
        for f in ("reserve_size", "page_size", "release_threshold"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, parse_size(v, f))
        if self.max_mapping is not None:
            object.__setattr__(self, "max_mapping", parse_size(self.max_mapping, "max_mapping"))
            if self.max_mapping == 0:
                raise ValueError("max_mapping must be positive (None: 64 MiB, or 256 MiB with footprint_limit)")
        for f in ("release_fraction", "footprint_limit"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"{f} must be a number, not {type(v).__name__}")
        if self.release_fraction is not None and not self.release_fraction >= 0:
            raise ValueError(f"release_fraction must be >= 0, got {self.release_fraction}")
        if self.footprint_limit is not None and not self.footprint_limit >= 1.0:
            raise ValueError(f"footprint_limit must be >= 1.0 (a factor of the live bytes), got {self.footprint_limit}")
        object.__setattr__(self, "peers", tuple(self.peers))
        if self.handle_type not in VMM_HANDLE_TYPES:
            raise ValueError(f"handle_type must be one of {list(VMM_HANDLE_TYPES)}, got {self.handle_type!r}")
        if self.location is not None and (isinstance(self.location, bool) or not isinstance(self.location, int)
                                          or self.location < 0):
            raise ValueError(f"location must be a device ordinal or None, got {self.location!r}")


class _Coverage:
    """The mapped pages as coalesced ranges of page indices: sorted starts and start -> end
    (exclusive). Answers "which pages of [lo, hi) are missing" in O(log n + gaps), whatever the size."""

    __slots__ = ("starts", "end")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.end: dict[int, int] = {}

    def covers(self, lo: int, hi: int) -> bool:
        """True when pages [lo, hi) are all mapped (one bisect: mapped pages are coalesced)."""
        starts = self.starts
        i = bisect_right(starts, lo) - 1
        return i >= 0 and self.end[starts[i]] >= hi

    def gaps(self, lo: int, hi: int) -> list[tuple[int, int]]:
        starts, end = self.starts, self.end
        i = bisect_right(starts, lo) - 1
        cur = lo
        if i >= 0 and end[starts[i]] > cur:
            cur = end[starts[i]]
        i += 1
        out = []
        while cur < hi:
            if i < len(starts) and starts[i] < hi:
                a = starts[i]
                if a > cur:
                    out.append((cur, a))
                cur = max(cur, end[a])
                i += 1
            else:
                out.append((cur, hi))
                break
        return out

    def missing(self, lo: int, hi: int) -> int:
        """How many of pages [lo, hi) are not mapped (:meth:`gaps` counted, no list built)."""
        starts, end = self.starts, self.end
        i = bisect_right(starts, lo) - 1
        held = 0
        if i >= 0:
            e = end[starts[i]]
            if e > lo:
                held = min(e, hi) - lo
        i += 1
        n = len(starts)
        while i < n:
            a = starts[i]
            if a >= hi:
                break
            e = end[a]
            held += (e if e < hi else hi) - a
            i += 1
        return hi - lo - held

    def add(self, a: int, b: int) -> None:
        """Pages [a, b), none of them mapped before."""
        starts, end = self.starts, self.end
        i = bisect_right(starts, a) - 1
        if i >= 0 and end[starts[i]] == a:  # extends its left neighbour
            a = starts.pop(i)
            del end[a]
        nb = end.pop(b, None)
        if nb is not None:  # and its right neighbour
            del starts[bisect_right(starts, b) - 1]
            b = nb
        insort(starts, a)
        end[a] = b

    def remove(self, a: int, b: int) -> None:
        """Pages [a, b), all mapped (inside one coalesced range)."""
        starts, end = self.starts, self.end
        i = bisect_right(starts, a) - 1
        s = starts.pop(i)
        e = end.pop(s)
        if s < a:
            insort(starts, s)
            end[s] = a
        if b < e:
            insort(starts, b)
            end[b] = e


class _VirtualChunks(ChunkSource):
    """The VMM's chunk source: carves the reservation (virtual only), maps a block's missing pages
    before it is handed out (:meth:`prepare`), and unmaps/moves/releases physical memory. Every
    method runs under the arena's lock."""

    returns_chunks = False  # the virtual range is kept; physical pages go back through trim()
    prepares = True
    # Only sizes that repeat within 64 misses are cached: a cache hit bypasses placement, and a
    # workload that runs again must land where it did (a block placed elsewhere may need pages mapped,
    # 40-90 us each, against the ~2 us a hit saves). A longer distance cached the sizes of a replayed
    # random workload and broke that (test_a_repeated_workload_maps_nothing_new). Blocks of at most
    # two pages (``hot_small``, set per instance: 4 MiB at the usual 2 MiB granularity) are judged by
    # the engine's own distance, as in the pool: a loop over many small sizes (a batch of 1 000) runs
    # on the cache, and a replayed workload's footprint did not move on the simulator
    # (bench_vmm_calls.py, 6-8 passes to 64 MiB, 1 GiB and 4 GiB), where caching every size so grew
    # it at 4 GiB (21.2 -> 22.9 GiB).
    hot_distance = 64

    def __init__(self, device: int, opts: "VirtualMemoryResourceOptions", drv: Driver, location: int,
                 page: int, reserve: int) -> None:
        self.arena: Arena | None = None  # set by the resource once its arena exists
        self.driver, self.device_id = drv, device
        self.options, self.page, self.reserve_size = opts, page, reserve
        self.hot_small = 2 * page  # see hot_distance
        self._location = location
        self.base = drv.mem_address_reserve(reserve, page)
        self.top = self.base  # the end of the carved range (ChunkSource.plain_pages)
        self._maps: dict[int, tuple[int, int]] = {}  # first page of a run -> (pages, handle)
        self._map_firsts: list[int] = []  # the keys of _maps, sorted (free memory finds its runs by bisection)
        self._cov = _Coverage()  # which pages are mapped, coalesced
        self._mapped = 0
        self._mapped_high = 0
        mapping = opts.max_mapping if opts.max_mapping is not None else \
            (256 << 20 if opts.footprint_limit is not None else 64 << 20)
        self._run_pages = max(1, mapping // page)
        # past three quarters of the device, runs of at most 64 MiB (see _NEAR_FULL_RUN)
        self._near_full = int(_NEAR_FULL_FRACTION * drv.device_total_mem(location))
        self._small_run = min(self._run_pages, max(1, _NEAR_FULL_RUN // page))
        self._pending: list = []  # (event, stream, runs) set aside by a non-blocking release
        self._pending_bytes = 0  # mapped bytes in those runs
        self._auto_release = opts.release_threshold is not None or opts.release_fraction is not None
        self._spare: dict[int, list[int]] = {}  # pages -> unmapped physical allocations (footprint_limit)
        self._spare_bytes = 0
        self._live_high = 0  # live bytes high-water mark, as seen when pages are mapped
        # footprint_limit's hard bound: the high-water mark of limit x live bytes plus one page per
        # live allocation (each may leave part of a page unused), as seen when pages are mapped
        self._allowance = 0
        self._moves = 0
        self._by_mapping = opts.footprint_limit is not None  # placement looks at what is mapped

    def __repr__(self) -> str:
        return repr(self.arena.owner)

    def plain_pages(self):
        """``(coverage, base, page)`` when this source's placement is the plain one — best fit keeping
        the block that ends at ``top`` for last, then pages mapped where missing — so that a compiled
        arena may run it in C (:meth:`ChunkSource.plain_pages`); None with a footprint limit or an
        automatic release, whose placement and bookkeeping are this module's."""
        if self._by_mapping or self._auto_release:
            return None
        return self._cov, self.base, self.page

    # -- growth: carve more of the reservation (virtual only) ------------------------------
    def grow(self, arena, size: int, stream: Stream, exact: bool):
        # When the requesting stream's free memory ends at the top of the carved range, carve only
        # what it lacks: the caller coalesces the two, so no unmapped free block is left above the
        # allocation (where later requests would map fresh pages instead of reusing mapped ones).
        st = arena.states.get(stream.uid)
        if st is not None and not exact:
            tail = st.free.ending_at(self.top)
            if tail is not None:
                size -= st.free.size_at(tail)
        want = -(-size // self.page) * self.page
        if self.top + want > self.base + self.reserve_size:
            raise OutOfMemoryError(
                f"{self!r} cannot allocate {size} bytes ({format_size(size)}): its "
                f"{format_size(self.reserve_size)} virtual reservation is exhausted", size, arena.owner)
        ptr = self.top
        self.top += want
        return ptr, want, ptr == self.base

    # -- placement and mapping ------------------------------------------------------------------
    def fit(self, arena, st, size):
        # Cached blocks coalesce first (so the choice never depends on what happened to be cached),
        # then best fit, keeping the "wilderness" — the free block at the top of the carved range —
        # for when no other block fits: holes are reused first and the top stays one piece. A
        # workload that runs again (a training step) then lands where it did before and maps
        # nothing new.
        if not arena.live and not arena.aligned:
            # nothing is live: coalesce every stream's cached blocks, so that a workload that starts
            # again from empty starts from one free range per stream — unless the best fit is mapped
            # already (a loop over a few sizes with nothing live between calls stays on the cache
            # instead of flushing it on every call); the hot sizes stay hot
            if not self._mapped_best_fit(st.free, size):
                for other in list(arena.states.values()):
                    if other.cached():
                        other.flush(arena.boundaries, keep=True)
        elif st.cached():
            st.flush(arena.boundaries)
        top = st.free.ending_at(self.top)
        if self._by_mapping:
            ptr = self._fit_mapped(st.free, size, top)
            if ptr is not None:
                return ptr
        return st.free.take(size, top)

    def _mapped_best_fit(self, free: FreeList, size: int) -> bool:
        """Whether the block the free list's best fit would cut for ``size`` lies in mapped pages:
        then taking it costs no driver call, whatever is cached."""
        got = free.candidates(size, 2)
        if not got:
            return False
        bsize, ptr = got[0]
        if ptr + bsize == self.top and len(got) > 1:  # take() keeps the wilderness when it can
            ptr = got[1][1]
        return self._covered(ptr, size)

    def _pages(self, ptr: int, size: int) -> tuple[int, int]:
        """The pages ``[ptr, ptr + size)`` touches, as a half-open range of page indices."""
        base, page = self.base, self.page
        return (ptr - base) // page, (ptr + size - 1 - base) // page + 1

    def _covered(self, ptr: int, size: int) -> bool:
        """Whether every page of ``[ptr, ptr + size)`` is mapped."""
        return self._cov.covers(*self._pages(ptr, size))

    def _missing(self, ptr: int, size: int) -> int:
        """How many pages of ``[ptr, ptr + size)`` are not mapped."""
        return self._cov.missing(*self._pages(ptr, size))

    @staticmethod
    def _ends(ptr: int, bsize: int, size: int) -> tuple:
        """Where ``size`` bytes may start at either end of the free block ``[ptr, ptr + bsize)``."""
        return (ptr,) if bsize == size else (ptr, ptr + bsize - size)

    def _fit_mapped(self, free: FreeList, size: int, top: int | None) -> int | None:
        """Placement that saves driver calls: of the few smallest free blocks that hold ``size``
        (``_PLACEMENT_WINDOW``), the one where the block would need the fewest pages mapped, at
        whichever end of it needs fewer; when each of them needs some, a mapped stretch inside any free
        block that holds it (:meth:`_mapped_inside`); None when the plain best fit is the choice after
        all (the caller takes it) or nothing fits."""
        window = free.candidates(size, _PLACEMENT_WINDOW)
        if not window:
            return None
        bsize, ptr = window[0]
        if ptr != top and self._covered(ptr, size):  # the plain best fit needs nothing mapped: the
            free.cut(ptr, ptr, size)                 # usual case, taken here (no second search)
            return ptr
        best = self._least_missing(window, size, top)
        if best is not None and best[0]:
            inner = self._mapped_inside(free, size)
            if inner is not None:
                ptr, at = inner
                free.cut(ptr, at, size)
                return at
        if best is None or (best[1] == window[0][1] and best[2] == best[1]):
            return None  # the plain best fit is the choice
        _, ptr, at = best
        free.cut(ptr, at, size)
        return at

    def _mapped_inside(self, free: FreeList, size: int):
        """``(block, at)``: of every free block, the smallest stretch of mapped pages that holds ``size``
        bytes (``at`` its start), or None. Asked only when the few smallest fitting blocks would need
        pages mapped at either end: a mapped stretch in the middle of a larger, partly unmapped block
        (one whose ends were moved away) serves the request with no driver call, where a move costs
        40-90 us. Under RMM's rules this placement took the calls per allocation from 2.2-2.5 to
        1.8-2.2 (1 GiB) and from 3.2-3.7 to 2.4-3.0 (4 GiB) on the simulator."""
        best = None
        for block, bsize in free.items():
            if bsize < size:
                continue
            stop = block + bsize
            for a, b in self._stretches(block, bsize):
                a, b = max(block, a), min(stop, b)
                if b - a >= size and (best is None or b - a < best[0]):
                    best = (b - a, block, a)
        return None if best is None else best[1:]

    def _least_missing(self, blocks, size: int, top: int | None = None):
        """``(missing pages, block, at)``: of the free ``blocks`` (``(size, ptr)`` pairs, each holding
        ``size``; ``top`` skipped), where ``size`` bytes would need the fewest pages mapped, at
        whichever end of its block needs fewer (the first such, stopping at none missing); None when
        there is none."""
        ends = [(ptr, at) for bsize, ptr in blocks if ptr != top for at in self._ends(ptr, bsize, size)]
        for ptr, at in ends:  # a first, cheap pass (one bisection each): an end that needs nothing
            if self._covered(at, size):
                return 0, ptr, at
        best = None
        for ptr, at in ends:
            missing = self._missing(at, size)
            if best is None or missing < best[0]:
                best = (missing, ptr, at)
        return best

    def _stretches(self, ptr: int, bsize: int):
        """The mapped stretches that meet the free block ``[ptr, ptr + bsize)``, lowest first, as
        ``(start, end)`` addresses (coalesced mapped pages; the first and last may reach past the
        block)."""
        page, base, starts, end = self.page, self.base, self._cov.starts, self._cov.end
        lo_p, hi_p = (ptr - base) // page, (ptr + bsize - base + page - 1) // page
        i = max(0, bisect_right(starts, lo_p) - 1)
        while i < len(starts) and starts[i] < hi_p:
            yield base + starts[i] * page, base + end[starts[i]] * page
            i += 1

    def _stretch_spots(self, ptr: int, bsize: int, size: int) -> tuple:
        """Where ``size`` bytes inside the free block ``[ptr, ptr + bsize)`` start or end with a mapped
        stretch of it (besides the block's two ends)."""
        last = ptr + bsize - size
        spans = list(self._stretches(ptr, bsize))
        return tuple([a for a, _ in spans if ptr < a <= last] + [b - size for _, b in spans if ptr <= b - size < last])

    def _fit_fewest_missing(self, free: FreeList, size: int) -> int | None:
        """Cut ``size`` bytes from a free block (over every free block that holds it: the footprint
        limit's last placement before a refusal), at either end of it or beside a mapped stretch inside
        it, where the fewest pages must be *created*: the pages missing there, less what can move to
        them (spare allocations, and mappings lying wholly in free memory outside that place) — then
        where the fewest are missing. None when nothing fits."""
        page, base = self.page, self.base
        movable = [(lo, hi) for _, (_, _, _, lo, hi, _) in self._free_runs(None)]
        supply = sum(hi - lo for lo, hi in movable) + self._spare_bytes
        best = None
        for ptr, bsize in free.items():
            if bsize < size:
                continue
            for at in self._ends(ptr, bsize, size) + self._stretch_spots(ptr, bsize, size):
                missing = self._missing(at, size) * page
                lo, hi = self._pages(at, size)
                a_lo, a_hi = base + lo * page, base + hi * page  # the pages the block touches
                inside = sum(h - l for l, h in movable if l < a_hi and h > a_lo)
                key = (max(0, missing - (supply - inside)), missing)
                if best is None or key < best[0]:
                    best = (key, ptr, at)
        if best is None:
            return None
        _, ptr, at = best
        free.cut(ptr, at, size)
        return at

    def prepare(self, arena, ptr, size, stream):
        if arena.closed:  # its free lists still name ranges of the reservation it gave back
            arena.state(stream).free.insert(ptr, size, arena.boundaries)  # back where it was (lock held)
            raise closed_resource(arena.owner)
        base, page = self.base, self.page
        if not self._cov.covers((ptr - base) // page, (ptr + size - 1 - base) // page + 1):
            ptr = self._map_or_retry(ptr, size, stream)
        if self._auto_release:
            self._release_excess(size)
        return ptr

    def _map_or_retry(self, ptr, size, stream):
        """Map the block's missing pages. Out of device memory: move free mappings into the block
        instead of creating pages; still out of memory: trim once, take again and map."""
        try:
            self._map_block(ptr, size, stream)
            return ptr
        except FootprintLimitError as refused:
            # the limit, not the device. Mappings set aside by a non-blocking release are held but in
            # no free list, and free memory of other streams can neither move (a mapping split
            # between two free lists lies wholly in neither) nor take the request: wait for the
            # set-aside ones and release them, wait for those streams and take their free memory over
            # (the block just given back coalesces with it), then try the free block that needs the
            # fewest new pages (with nothing changed, a block other than the one refused). Still
            # refused: with blocks live the refusal stands (pages stranded beside them stay; a trim
            # there changed no refusal on RMM's workload); with nothing live, every mapping goes and the
            # request is mapped afresh, so the bound always has room (a mapping that holds part of the
            # block being placed and free pages beside it can neither move nor go while the block is
            # placed there, and its free pages count against the bound)
            st = self.arena.state(stream)
            changed = self.take_back_set_aside(self.arena)
            if any(o is not st and (o.free or o.cached()) for o in list(self.arena.states.values())):
                self.arena.quiesce(st)
                changed = True
            other = self._fit_fewest_missing(st.free, size)
            if other is not None and (other != ptr or changed):
                try:
                    self._map_block(other, size, stream)
                    return other
                except FootprintLimitError as again:
                    refused = again
            elif other is not None:
                st.free.insert(other, size, self.arena.boundaries)
            if self.arena.live_total():
                raise refused
            return self._map_afresh(size, stream)
        except OutOfMemoryError:
            pass
        if self._run_pages > self._small_run:
            # The first time: runs of at most 64 MiB from now on (see _NEAR_FULL_RUN), and a trim
            # releases the free runs, to be mapped again in small runs.
            self._run_pages = self._small_run
        else:
            # Later: move what the block lacks from free mappings, a few driver calls per mapping
            # moved, where a trim released every free mapping and created most of them again (a
            # thousand and more per thousand operations at 95 % of the device).
            ptr = self.arena.find(size, stream)
            try:
                self._map_block(ptr, size, stream, short=True)
                return ptr
            except OutOfMemoryError:
                pass
        return self._map_afresh(size, stream)

    def _map_afresh(self, size, stream):
        """Trim (every free mapping released), take a block for the request again and map it."""
        self.trim_locked()
        ptr = self.arena.find(size, stream)
        self._map_block(ptr, size, stream)
        return ptr

    def _map_block(self, ptr, size, stream, short=False):
        """``_ensure_mapped``; if it fails, the block goes back to its stream's free list."""
        try:
            self._ensure_mapped(ptr, size, short)
        except BaseException:
            self.arena.state(stream).free.insert(ptr, size, self.arena.boundaries)
            raise

    def _release_excess(self, size):
        opts = self.options
        live = self.arena.live_total()
        free = self._mapped - self._pending_bytes - live - size  # free mapped, not yet set aside
        limit = min(opts.release_threshold if opts.release_threshold is not None else free,
                    int(opts.release_fraction * live) if opts.release_fraction is not None else free)
        if free > limit:
            # release down to half the limit (hysteresis: the next few frees do not trigger again),
            # from the top of the range down, so the mapped memory stays packed at the bottom
            self.release_async(free - limit // 2)

    def _ensure_mapped(self, ptr: int, size: int, short: bool = False) -> None:
        """:meth:`_map_missing`; if it fails, the footprint limit's marks are as they were: a request
        the device refused after the bound allowed it must not leave the bound raised (the physical
        memory could otherwise grow later to what only that refused request would have justified)."""
        marks = self._allowance, self._live_high
        try:
            self._map_missing(ptr, size, short)
        except BaseException:
            self._allowance, self._live_high = marks
            raise

    def _map_missing(self, ptr: int, size: int, short: bool = False) -> None:
        """Map every missing page of [ptr, ptr+size), in runs of up to ``max_mapping`` (or the size
        of a spare physical allocation being moved here), as one transaction: if any step fails, the
        runs mapped by this call are unmapped, created ones released and moved ones kept spare.
        ``short``: the device is out of memory, so first unmap free mappings enough for every missing
        page and move them here (whatever their sizes), creating only what they do not cover."""
        page, base = self.page, self.base
        gaps = self._cov.gaps(*self._pages(ptr, size))
        if not gaps:
            return
        limit = self.options.footprint_limit
        missing = sum(b - a for a, b in gaps) * page
        if self._mapped + self._spare_bytes + missing > self._near_full:
            self._run_pages = self._small_run
        if short:
            self._unmap_free(missing - self._spare_bytes, release_large=True)
            if limit is not None:
                self._check_bound(missing // page, size, limit, self.arena.live_total() + size)
        elif limit is not None:
            self._make_room(missing // page, size, limit)
        run = self._run_pages
        if limit is not None:
            # under a limit, runs of an eighth of the block (at least 64 MiB, or a page-run near a full
            # device): a run goes back only whole, and one partly reused beside a live block strands
            # the rest (runs of 256 MiB for blocks of about 512 MiB stranded enough to pass a limit of
            # 1.1 on RMM's workload to 1 GiB)
            run = min(run, max(self._small_run, (-(-size // page)) // _RUNS_PER_BLOCK))
        drv, dev = self.driver, self.device_id
        done: list[tuple[int, int, int, bool]] = []  # (first page, pages, handle, moved)
        try:
            starts, top = self._cov.starts, (self.top - base) // page  # never map past the carved range
            for a, b in gaps:
                first = a
                while a < b:
                    if self._spare_bytes:
                        # a spare larger than the gap may overhang into the unmapped free pages above;
                        # one under half of what is left to map (or half a run) is not taken: moved
                        # pieces would multiply, and every later move costs per mapping, whatever its
                        # size — it is released, and a run is created in its place. Nothing larger
                        # than a run is taken: near a full device runs shrink, and larger spares are
                        # released too
                        k = bisect_right(starts, a)
                        reach = min(starts[k] if k < len(starts) else top, top) - a
                        most = min(b - a, run)
                        n, h = self._take_spare(most, min(reach, run), 0 if short else most // 2)
                    else:
                        n, h = 0, None
                    moved = h is not None
                    if not moved:
                        n = min(b - a, run)
                        if limit is not None and self._spare_bytes:
                            # spares passed over (too small): where creating would go past the limit,
                            # release them first, smallest first (the driver counts the peak meanwhile)
                            held = self._mapped + self._spare_bytes + sum(d[1] for d in done) * page
                            self._release_spare(held + n * page - int(limit * self._live_high), smallest=True)
                        try:
                            h = drv.mem_create(self._location, n * page, self.options.handle_type)
                        except OutOfMemoryError:
                            if not self._spare_bytes:
                                raise
                            self._release_spare()  # spares that fit no gap: their memory, then again
                            h = drv.mem_create(self._location, n * page, self.options.handle_type)
                    va, nbytes = base + a * page, n * page
                    try:
                        drv.mem_map(va, nbytes, 0, h)
                    except BaseException:
                        if moved:
                            self._put_spare(n, h)
                        else:
                            drv.mem_release(h)
                        raise
                    done.append((a, n, h, moved))
                    a += n
                # one access call for the whole gap (it may span several mappings, all whole)
                va, nbytes = base + first * page, (a - first) * page
                drv.mem_set_access(va, nbytes, dev, "readwrite")
                for peer in self.options.peers:
                    if peer != dev:
                        drv.mem_set_access(va, nbytes, peer, "readwrite")
        except BaseException as exc:
            for start, n, h, moved in reversed(done):
                drv.mem_unmap(base + start * page, n * page)
                if moved:
                    self._put_spare(n, h)
                else:
                    drv.mem_release(h)
            if isinstance(exc, OutOfMemoryError):
                raise OutOfMemoryError(
                    f"{self!r} could not map physical memory for {size} bytes ({format_size(size)}): "
                    f"{self._mapped} bytes mapped, {self.arena.live_total()} live; {exc}", size, self.arena.owner) from None
            raise
        for start, n, h, moved in done:
            self._maps[start] = (n, h)
            insort(self._map_firsts, start)
            self._cov.add(start, start + n)
            self._mapped += n * page
            self._moves += moved
        if self._spare_bytes:
            # spares too large for this block's gaps: give back what exceeds the limit (all of them
            # without one: they were unmapped only because the device was out of memory)
            self._release_spare(None if limit is None else
                                self._mapped + self._spare_bytes - int(limit * self._live_high))
        physical = self._mapped + self._spare_bytes
        if physical > self._mapped_high:
            self._mapped_high = physical

    # -- moving physical memory (footprint_limit) ------------------------------------------------
    def _take_spare(self, most: int, reach: int, least: int = 0) -> tuple[int, int | None]:
        """The largest spare allocation of ``least`` to ``most`` pages, else the smallest of at most
        ``reach`` pages, taken out: ``(pages, handle)``. ``_spare`` holds no empty lists, so this looks
        at the sizes spare now, not every size ever spared."""
        best = over = 0
        for n in self._spare:
            if n < least:
                continue
            if best < n <= most:
                best = n
            elif most < n <= reach and (not over or n < over):
                over = n
        best = best or over
        if not best:
            return 0, None
        self._spare_bytes -= best * self.page
        hs = self._spare[best]
        h = hs.pop()
        if not hs:
            del self._spare[best]
        return best, h

    def _put_spare(self, n: int, h: int) -> None:
        self._spare.setdefault(n, []).append(h)
        self._spare_bytes += n * self.page

    def _make_room(self, pages: int, size: int, limit: float) -> None:
        """Before mapping ``pages`` new pages for a ``size``-byte block: if creating them would hold
        more than ``limit`` x the live high-water mark, unmap mappings lying wholly in free memory
        (highest addresses first, so the mapped memory stays packed low) and keep their physical
        allocations spare, to be mapped where they are needed. If the physical memory would still pass
        the limit's hard bound (:meth:`_check_bound`), raise :class:`FootprintLimitError`: nothing is
        created."""
        page = self.page
        live = self.arena.live_total() + size
        self._live_high = high = max(self._live_high, live)
        create = max(0, pages * page - self._spare_bytes)
        self._unmap_free(self._mapped + self._spare_bytes + create - int(limit * high))
        self._check_bound(pages, size, limit, live)

    def _check_bound(self, pages: int, size: int, limit: float, live: int) -> None:
        """Creating ``pages`` more pages for a ``size``-byte block, ``live`` bytes live with it, must
        keep the physical memory within the hard bound: the high-water mark of ``limit`` x live bytes
        + one page per live allocation (this one included). Else :class:`FootprintLimitError`; the
        mark rises only when the mapping it allows is made (a refused request raises nothing)."""
        bound = max(self._allowance, int(limit * live) + self.page * (len(self.arena.live) + 1))
        held = self._mapped + self._spare_bytes
        after = held + max(0, pages * self.page - self._spare_bytes)
        if after > bound:
            raise FootprintLimitError(
                f"{self!r} refused {size} bytes ({format_size(size)}): mapping them would hold {after} bytes "
                f"({format_size(after)}) of physical memory, past its footprint_limit={limit} bound of "
                f"{bound} bytes ({format_size(bound)}: {limit} x the live high-water mark plus one page per "
                f"live allocation); {held} bytes are held, {self.arena.live_total()} live, and no free "
                "mapping is left to move (the free memory lies in mappings that also hold live blocks)",
                size, self.arena.owner)
        self._allowance = bound

    def _unmap_free(self, need: int, release_large: bool = False) -> None:
        """Unmap mappings lying wholly in free memory, ``need`` bytes of them at least if there are
        (highest addresses first, so the mapped memory stays packed low), and keep their physical
        allocations spare, to be mapped where they are needed. ``release_large`` (out of device
        memory): every free mapping larger than the small runs now mapped (made before the device
        filled up) is released instead, so that its pages come back in small runs — a large run partly
        reused beside a live block strands its free pages — and the spares come from the others."""
        small = self._small_run if release_large else None
        if need <= 0 and small is None:
            return
        runs = self._free_runs(None if small is not None else need)
        release = [] if small is None else [c for c in runs if c[1][1] > small]
        keep, got = [], 0
        for c in runs:
            if got >= need:
                break
            if small is None or c[1][1] <= small:
                keep.append(c)
                got += c[1][4] - c[1][3]
        waited = set()  # unmapping is not stream ordered: wait for the streams that freed them
        for st, _ in release + keep:
            if id(st) not in waited:
                waited.add(id(st))
                self.arena.wait_for(st.stream)
        for _, (first, n, h, *_) in release:
            self._unmap(first, n, h)
        drv, page = self.driver, self.page
        for _, (first, n, h, lo, hi, block) in keep:
            drv.mem_unmap(lo, n * page)
            self._forget_run(first, n)
            self._put_spare(n, h)

    def _release_spare(self, most: int | None = None, smallest: bool = False) -> int:
        """Release spare allocations, largest (or ``smallest``) first: all of them, or until ``most``
        bytes."""
        released = 0
        for n in sorted(self._spare, reverse=not smallest):
            hs = self._spare[n]
            while hs and (most is None or released < most):
                self.driver.mem_release(hs.pop())
                self._spare_bytes -= n * self.page
                released += n * self.page
            if not hs:
                del self._spare[n]
        return released

    def _runs_in(self, free: FreeList):
        """The mappings lying wholly inside one free block of ``free``, with that block's start."""
        for block, bsize in free.items():
            yield from self._runs_in_block(block, bsize)

    def _runs_in_block(self, block: int, bsize: int, down: bool = False):
        """The mappings lying wholly inside the free block ``[block, block + bsize)``, found by
        bisection (not a scan of every run), lowest first or, with ``down``, highest first:
        ``(first page, pages, handle, lo, hi, block)``."""
        page, base, maps, firsts = self.page, self.base, self._maps, self._map_firsts
        lo_page = -(-(block - base) // page)
        hi_page = (block + bsize - base) // page
        k, end = bisect_left(firsts, lo_page), bisect_left(firsts, hi_page)
        if k == end:
            return
        if down:
            # the last run starting in the block may stick out of it; every one below it is inside
            first = firsts[end - 1]
            if first + maps[first][0] > hi_page:
                end -= 1
            order = range(end - 1, k - 1, -1)
        else:
            order = range(k, end)
        for i in order:
            first = firsts[i]
            n, h = maps[first]
            if first + n > hi_page:
                break
            yield first, n, h, base + first * page, base + (first + n) * page, block

    def _free_runs(self, need: int | None) -> list:
        """``(state, run)`` for the mappings lying wholly in the free memory of streams that can be
        waited for, highest addresses first (the mapped memory stays packed low); with ``need``, only
        the first ones that together cover ``need`` bytes (the walk stops there)."""
        blocks = []
        for st in list(self.arena.states.values()):
            st.flush(self.arena.boundaries)
            if st.free and st.stream.alive is True:
                blocks.extend((block, bsize, st) for block, bsize in st.free.items())
        blocks.sort(key=lambda b: b[0], reverse=True)  # free blocks never overlap: runs come out in order
        chosen, got = [], 0
        for block, bsize, st in blocks:
            for run in self._runs_in_block(block, bsize, down=True):
                if need is not None and got >= need:
                    return chosen
                chosen.append((st, run))
                got += run[4] - run[3]
        return chosen

    def _unmap(self, first: int, n: int, h: int) -> int:
        drv, page = self.driver, self.page
        lo = self.base + first * page
        drv.mem_unmap(lo, n * page)
        drv.mem_release(h)
        self._forget_run(first, n)
        return n * page

    def _forget_run(self, first: int, n: int) -> None:
        del self._maps[first]
        firsts = self._map_firsts
        del firsts[bisect_left(firsts, first)]
        self._cov.remove(first, first + n)
        self._mapped -= n * self.page

    def trim_locked(self) -> int:
        arena = self.arena
        home = arena.state(DEFAULT_STREAM)
        released = self._release_spare() + self._drain_pending(wait=True)
        # Unmapping is not stream ordered: wait for the streams that freed the memory first (their
        # caches, home's too, are detached before the wait: rule 7 of the engine).
        arena.quiesce(home, own=True)
        for first, n, h, *_ in list(self._runs_in(home.free)):
            released += self._unmap(first, n, h)
        return released

    def release_async(self, excess: int | None = None) -> int:
        """Set aside free mappings behind one event per stream and release those whose events
        completed; never blocks (streams mrkit cannot prove alive are left for trim()). With
        ``excess``, only enough mappings to cover it, highest addresses first; else all of them."""
        released = self._release_spare() + self._drain_pending(wait=False)
        drv = self.driver
        candidates = self._free_runs(excess)
        by_state: dict[int, tuple] = {}
        for st, run in candidates:
            by_state.setdefault(id(st), (st, []))[1].append(run)
        for st, runs in by_state.values():
            with st.stream.hold() as alive:  # its own thread may close it meanwhile: held for the event
                if alive is not True:  # closed since the runs were chosen: left in place for trim()
                    continue
                by_block: dict[int, list] = {}
                for first, n, h, lo, hi, block in runs:
                    by_block.setdefault(block, []).append((lo, hi))
                for block, spans in by_block.items():  # carve the runs out: the gaps stay free
                    for lo, hi in sorted(spans):
                        block = st.free.cut(block, lo, hi - lo)
                ev = drv.event_create(self.device_id)
                with device_scope(drv, self.device_id, st.stream):
                    drv.event_record(ev, st.stream.handle)
            self._pending.append((ev, st.stream, [r[:5] for r in runs]))
            self._pending_bytes += sum(r[4] - r[3] for r in runs)
        return released + self._drain_pending(wait=False)

    def take_back_set_aside(self, arena) -> bool:
        # out of memory (the reservation carved to its end, the device full) or refused by the limit:
        # the mappings a non-blocking trim set aside hold carved ranges in no free list; wait for their
        # streams, release them (what the trim asked for) and give their ranges back to the free lists
        if not self._pending:
            return False
        self._drain_pending(wait=True)
        return True

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
            st = self.arena.state(stream)
            for first, n, h, lo, hi in runs:
                released += self._unmap(first, n, h)
                self._pending_bytes -= hi - lo
                st.free.insert(lo, hi - lo, self.arena.boundaries)
        self._pending = keep
        return released



class VirtualMemoryResource(CachingResource):
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

    With ``footprint_limit``, physical memory moves instead of growing: mappings lying wholly in free
    memory are unmapped (after their streams are waited for) and their allocations, kept spare, are
    mapped into the block that needs pages; a spare larger than a gap may overhang into unmapped free
    pages above it.

    Invariant: every live block and every block in an exact-size cache is fully mapped; only blocks in
    the coalesced free lists (and the carved range above them) may have unmapped pages, and taking one
    maps them.

    Undo on failure: mapping a block's pages is one transaction; if any ``cuMemCreate``/``cuMemMap``/
    ``cuMemSetAccess`` fails (out of memory half-way, say) the pages mapped by that call are unmapped
    and released, and the block returns to the free list. Out of device memory, the resource maps in
    runs of at most 64 MiB from then on and tries again: the first time after a trim, later by moving
    free mappings into the block (and releasing free runs larger than 64 MiB), with a trim only when
    that is not enough.
    """

    __slots__ = ("_src",)

    def __init__(self, device: int = 0, options: VirtualMemoryResourceOptions | None = None, *,
                 driver: Driver | None = None) -> None:
        opts = options or VirtualMemoryResourceOptions()
        if not isinstance(opts, VirtualMemoryResourceOptions):
            raise TypeError(f"options must be VirtualMemoryResourceOptions, not {type(opts).__name__}")
        device = check_device(device)
        drv = driver or get_driver()
        if not drv.device_capability(device, "virtual_memory_management_supported"):
            raise ValueError(f"device {device} does not support virtual memory management")
        location = device if opts.location is None else opts.location
        gran = drv.mem_get_allocation_granularity(location, handle_type=opts.handle_type)
        page = opts.page_size or gran
        if page % gran:
            raise ValueError(f"page_size {page} must be a multiple of the allocation granularity {gran}")
        reserve = opts.reserve_size or 2 * drv.device_total_mem(device)
        reserve = -(-reserve // page) * page
        src = self._src = _VirtualChunks(device, opts, drv, location, page, reserve)
        src.arena = Arena(src, self, device_id=device, driver=drv, ordered=True)
        self._attach(src.arena)

    # -- properties ---------------------------------------------------------------------------
    device_accessible = True
    host_accessible = False
    max_alignment = 1 << 20

    driver = property(lambda self: self._src.driver)
    device_id = property(lambda self: self._src.device_id)
    options = property(lambda self: self._src.options)
    page = property(lambda self: self._src.page, doc="The unit of physical memory, in bytes.")
    base = property(lambda self: self._src.base, doc="The first address of the reservation.")

    @property
    def pool_size(self) -> int:
        """Virtual bytes carved from the reservation so far."""
        return self.arena.held

    @property
    def mapped_bytes(self) -> int:
        """Physical bytes mapped now."""
        return self._src._mapped

    @property
    def physical_bytes(self) -> int:
        """Physical bytes held now: ``mapped_bytes`` plus, with ``footprint_limit``, allocations
        unmapped from free memory and not yet mapped again."""
        return self._src._mapped + self._src._spare_bytes

    @property
    def page_size(self) -> int:
        """Bytes of one page: the unit of physical memory (``options.page_size``, or the device's
        allocation granularity)."""
        return self._src.page

    @property
    def mapped_high(self) -> int:
        """Highest ``physical_bytes`` since construction (or :meth:`reset_mapped_high`)."""
        return self._src._mapped_high

    @property
    def moves(self) -> int:
        """Physical allocations moved (unmapped from free memory and mapped elsewhere) so far."""
        return self._src._moves

    def reset_mapped_high(self) -> None:
        self._src._mapped_high = self.physical_bytes

    @property
    def reserved_bytes(self) -> int:
        """Virtual bytes reserved."""
        return self._src.reserve_size

    def trim(self, wait: bool = True) -> int:
        """Unmap and release every mapping lying wholly in free memory, and every spare allocation
        (``footprint_limit``); returns the bytes released. Safe to call while other threads allocate.

        ``wait=True`` first waits for the streams that freed that memory (the whole device only when
        one of them may be gone). ``wait=False`` blocks on nothing: it records one event per stream
        holding free memory, sets those mappings aside, and releases each once its event has completed
        (checked on every later trim and slow-path allocation). A later allocation maps pages again."""
        with self.arena.lock:
            self.arena.apply_deferred()  # frees that found the lock taken (rule 8) go back too
            return self._src.trim_locked() if wait else self._src.release_async()

    release = trim

    def _when_dropped(self) -> tuple:
        return (_trim_dropped, self.arena, self._src)

    def close(self) -> None:
        """Release every page and the reservation (all allocations must have been freed)."""
        arena, src = self.arena, self._src
        with arena.lock:
            if arena.live or arena.aligned:
                raise still_live(self, len(arena.live) + len(arena.aligned))
            arena.closed = True
            arena.apply_deferred()
            src.trim_locked()
            if src.base:
                src.driver.mem_address_free(src.base, src.reserve_size)
                src.base = 0
                home = arena.state(DEFAULT_STREAM)
                for uid, st in list(arena.states.items()):
                    if st is not home:
                        arena.retire_into(uid, st, home)
            arena.close_event()

    def _describe(self) -> str:
        src = self._src
        extra = "" if src._location == src.device_id else f", location={src._location}"
        if src.options.handle_type != "none":
            extra += f", handle_type={src.options.handle_type}"
        return (f"device={src.device_id}, reserved={format_size(src.reserve_size)}, "
                f"mapped={format_size(src._mapped)}{extra}, driver={src.driver.name}")


def _trim_dropped(arena, src) -> None:
    """A collected VMM's :meth:`VirtualMemoryResource.trim`: its free pages unmapped and released,
    after waiting for the device (as the engine's ``_release_dropped`` does); nothing is waited for
    when it holds no physical memory (mapped or spare)."""
    if not (src._mapped or src._spare_bytes):
        return
    arena.wait_for_device()
    with arena.lock:
        arena.apply_deferred()
        src.trim_locked()
