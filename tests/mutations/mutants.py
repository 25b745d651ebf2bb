"""Planted bugs: each is a small edit to a copy of the package that a correct kit must catch.

Each mutant names the file, the exact text it replaces (every occurrence; the text must occur), the
replacement, and the shipped factories (``mrkit.testing.BUILTIN_FACTORIES``) the kit runs on to
find it. ``run.py`` applies each to a copy of ``mrkit/`` and runs the kit there under the ``ci``
profile; the kit must fail (any failure counts: an assertion, a race report, an error).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the package directory
    old: str
    new: str
    targets: tuple[str, ...]
    kit: str = "machine"  # "machine": conformance and state machine; "races": the race test alone


POOLS = ("pool(cuda)", "pool(device)", "statistics(pool(device))")
VMMS = ("vmm", "vmm(auto-release)", "vmm(moving pages, footprint_limit=1.0)")

MUTANTS = [
    # -- the engine: stream hand-over, stealing, reclaim, release ------------------------------
    Mutant("hand-over without an event", "_engine/_arena.py",
           "            drv.stream_wait_event(dst.handle, self.event)", "            pass", POOLS),
    Mutant("hand-over records the event on the wrong stream", "_engine/_arena.py",
           "drv.event_record(self.event, src.handle)", "drv.event_record(self.event, dst.handle)", POOLS),
    Mutant("steal without ordering the streams", "_engine/_arena.py",
           "        self.order_after(other.stream, st.stream)\n", "        pass\n", POOLS),
    Mutant("quiesce does not wait for the streams", "_engine/_arena.py",
           "                self.wait_for(st.stream)\n", "                pass\n", POOLS + ("binning(cuda)",)),
    Mutant("a collected stream's memory taken without a device synchronise", "_engine/_arena.py",
           "                drv.ctx_synchronize(self.device_id or 0)\n                return",
           "                return", POOLS),
    Mutant("retiring a state drops its cached blocks", "_engine/_arena.py",
           "        if old:\n            self._drain(old, boundaries)", "        pass", POOLS),
    Mutant("release gives back chunks that are not wholly free", "_engine/_arena.py",
           "            if self.chunks.get(ptr) == size:", "            if ptr in self.chunks:", POOLS),
    Mutant("blocks coalesce across upstream chunks", "_engine/_arena.py",
           "        dst.free = dst.free.absorb(src.free, self.boundaries)", "        dst.free = dst.free.absorb(src.free, set())",
           POOLS),
    Mutant("a freed block goes to the default stream's cache", "_engine/_arena.py",
           "        st = self.state(stream)  # a state in the table is never retired (rule 4)",
           "        st = self.state(DEFAULT_STREAM)", ("pool(cuda)", "statistics(pool(device))", "binning(cuda)")),
    # -- free lists --------------------------------------------------------------------------------
    Mutant("coalescing with the next block overstates its size", "_engine/_freelist.py",
           "            size += nsize\n", "            size += nsize + 256\n", POOLS + VMMS[:1]),
    Mutant("best fit leaves an overlapping remainder", "_engine/_freelist.py",
           "            self.add(ptr + size, bsize - size)",
           "            self.add(ptr + size - 256, bsize - size + 256)", POOLS + VMMS[:1]),
    Mutant("best fit may pick a block that is too small", "_engine/_freelist.py",
           "        i = bisect_left(sizes, size)\n        if i == len(sizes):\n            return None\n        bsize",
           "        i = max(0, bisect_left(sizes, size) - 1)\n        if i == len(sizes):\n            return None\n        bsize", POOLS + VMMS[:1]),
    # -- the hot path -------------------------------------------------------------------------------
    Mutant("a cache hit is not recorded as live", "_engine/_hot.py",
           "                    live[ptr] = nbytes\n                    return ptr",
           "                    return ptr", POOLS),
    Mutant("a lock-free free caches under the wrong size", "_engine/_hot.py",
           "        size = (nbytes + 255) & -256\n        st = states_get(stream.uid)\n        if st is not None:\n            cache = st.cache",
           "        size = (nbytes + 511) & -256\n        st = states_get(stream.uid)\n        if st is not None:\n            cache = st.cache",
           POOLS),
    # -- races between threads (found by the controlled interleavings of mrkit.testing.race_test) ------
    Mutant("race: a free appends to a cache list a flush has just detached", "_engine/_hot.py",
           "                    if st.cache is cache:  # rule 3: still attached, so the block is where it belongs\n"
           "                        return\n                    arena.rescue(lst, size, stream)\n                    return",
           "                    return", POOLS, kit="races"),
    Mutant("race: a flush drains the lists before swapping the dict", "_engine/_arena.py",
           "        if keep:\n            self.cache = {s: [] for s in old}\n        else:\n            self.cache, self.hot = {}, []\n"
           "        self._drain(old, boundaries)",
           "        self._drain(old, boundaries)\n        if keep:\n            self.cache = {s: [] for s in old}\n"
           "        else:\n            self.cache, self.hot = {}, []", POOLS, kit="races"),
    # The "retired state keeps usable cache lists" is equivalent here (a retired state is merged,
    # and the merge's flush detaches whatever cache it kept); the planted form is a retired state left
    # in the table, where the next free of its stream meets a detached cache.
    Mutant("race: a retired stream state stays in the table", "_engine/_arena.py",
           "        if self.states.get(uid) is st:\n            del self.states[uid]\n", "", POOLS, kit="races"),
    Mutant("race: the limit is read before its lock is taken", "adaptors/_others.py",
           "        with self._lock:\n            used = self._used\n            if used + nbytes > self.limit:",
           "        used = self._used\n        with self._lock:\n            if used + nbytes > self.limit:",
           ("limiting(pool(cuda), 4 MiB)",), kit="races"),
    Mutant("race: trim(wait=False) runs without the arena lock", "resources/_vmm.py",
           "        with self.arena.lock:\n            self.arena.apply_deferred()  # frees that found the lock taken (rule 8) go back too\n"
           "            return self._src.trim_locked() if wait else self._src.release_async()",
           "        if not wait:\n            return self._src.release_async()\n        with self.arena.lock:\n"
           "            self.arena.apply_deferred()\n            return self._src.trim_locked()", VMMS, kit="races"),
    # -- the VMM -------------------------------------------------------------------------------------
    Mutant("the footprint limit's bound is not enforced", "resources/_vmm.py",
           "        if after > bound:\n", "        if False:\n", ("vmm(moving pages, footprint_limit=1.0)",)),
    Mutant("VMM trim unmaps without waiting for the streams", "resources/_vmm.py",
           "        arena.quiesce(home, own=True)\n", "        pass\n", VMMS),
    Mutant("VMM maps one page short", "resources/_vmm.py",
           "        return (ptr - base) // page, (ptr + size - 1 - base) // page + 1\n",
           "        return (ptr - base) // page, (ptr + size - 1 - base) // page\n", VMMS),
    Mutant("VMM moves pages without waiting for the streams that freed them", "resources/_vmm.py",
           "                waited.add(id(st))\n                self.arena.wait_for(st.stream)\n",
           "                waited.add(id(st))\n                pass\n",
           ("vmm(moving pages, footprint_limit=1.0)",)),
    Mutant("VMM out of device memory maps the block it gave back, without taking it again", "resources/_vmm.py",
           "            ptr = self.arena.find(size, stream)\n            try:\n                self._map_block(ptr, size, stream, short=True)",
           "            try:\n                self._map_block(ptr, size, stream, short=True)",
           ("vmm",)),
    Mutant("cutting a block out of a free one leaves it free too (VMM placement, auto-release)",
           "_engine/_freelist.py",
           "            self.add(at + size, end - at - size)",
           "            self.add(at, end - at)",
           ("vmm(moving pages, footprint_limit=1.0)", "vmm(auto-release)")),
    Mutant("VMM out of memory releases large free runs without waiting for their streams", "resources/_vmm.py",
           "        for st, _ in release + keep:", "        for st, _ in keep:", ("vmm(256 MiB mappings)",)),
    # -- adaptors -------------------------------------------------------------------------------------
    Mutant("statistics forget frees", "adaptors/_statistics.py",
           "            events.append(-nbytes)\n", "            pass\n",
           ("statistics(pool(device))", "statistics(host)")),
    Mutant("limiting adaptor never gives bytes back", "adaptors/_others.py",
           "            with self._lock:\n                self._used -= nbytes\n\n    def _describe",
           "            pass\n\n    def _describe", ("limiting(cuda)", "statistics(limiting(pool(device)))")),
    Mutant("limiting adaptor lets one request past the limit", "adaptors/_others.py",
           "            if used + nbytes > self.limit:", "            if used > self.limit:",
           ("limiting(pool(cuda), 4 MiB)", "retry(limiting(pool(cuda)))")),
    Mutant("tracking adaptor keeps freed allocations", "adaptors/_others.py",
           "                raise size_mismatch(nbytes, entry[0], ptr)\n            del self._live[ptr]",
           "                raise size_mismatch(nbytes, entry[0], ptr)",
           ("tracking(logging(pool(cuda)))",)),
    Mutant("logging adaptor drops frees", "adaptors/_logging.py",
           "        buf.append(event)\n        try:\n            self._up_free(ptr, nbytes, stream, alignment)",
           "        try:\n            self._up_free(ptr, nbytes, stream, alignment)",
           ("cuda", "pool(cuda)")),
    Mutant("binning hands out a size class one step too small", "resources/_binning.py",
           "        ptr = self._bin_alloc(max(self.min_bin, 1 << (nbytes - 1).bit_length()), stream)",
           "        ptr = self._bin_alloc(max(self.min_bin, 1 << (nbytes - 1).bit_length() - 1), stream)",
           ("binning(cuda)", "statistics(binning(device))")),
    Mutant("statistics count a zero-size free", "adaptors/_statistics.py",
           "        if c is not None:  # memory it never counted",
           "        if c is not None or not nbytes:  # memory it never counted",
           ("statistics(host)", "statistics(binning(device))")),
    Mutant("a popped frame's peak folds in without the frame below's current bytes", "adaptors/_statistics.py",
           "            low[1] = max(low[1], low[0] + top[1])", "            low[1] = max(low[1], top[1])",
           ("statistics(host)", "statistics(pool(device))")),
    Mutant("a pushed frame starts from the counters below", "adaptors/_statistics.py",
           "            self._stack.append([0, 0, 0, 0, 0, 0])", "            self._stack.append(list(self._stack[-1]))",
           ("statistics(host)", "statistics(pool(device))")),
    Mutant("the profiler keeps its last call's peak instead of the highest", "statistics.py",
           "        self.peak_bytes = max(self.peak_bytes, s.peak_bytes)", "        self.peak_bytes = s.peak_bytes",
           ("statistics(host)", "pool(cuda)")),
    Mutant("limiting adaptor refuses a request that exactly reaches the limit", "adaptors/_others.py",
           "            if used + nbytes > self.limit:", "            if used + nbytes >= self.limit:",
           ("limiting(cuda)", "statistics(limiting(pool(device)))")),
    Mutant("a hand-over from the default stream is recorded on the caller's device", "_engine/_arena.py",
           "        with device_scope(drv, self.device_id or 0, src, dst):",
           "        with device_scope(drv, drv.current_device(), src, dst):", POOLS),
    Mutant("CuPy's hooks keep serving a device after its current resource was replaced", "integrations/cupy.py",
           "                t.pop(dev, None)\n", "                pass\n", ("pool(cuda)", "statistics(pool(device))")),
    Mutant("CuPy's hooks over a pool free on the default stream", "integrations/cupy.py",
           "        dealloc(ptr, entry[0], entry[1])", "        dealloc(ptr, entry[0], DEFAULT_STREAM)",
           ("pool(cuda)", "statistics(pool(device))")),
    Mutant("PyTorch frees go to the current resource, not the owning one", "integrations/torch.py",
           "            entry[0].deallocate(ptr, entry[1], entry[2])",
           "            get_current_resource(device).deallocate(ptr, entry[1], entry[2])",
           ("pool(cuda)", "statistics(pool(device))")),
    Mutant("a deep copy of a resource owns its memory too", "_owned.py",
           "    def __deepcopy__(self, memo):\n        return self\n\n    def __reduce__(self):",
           "    def _reduce_unused(self):", ("host",)),
    # -- the simulator's race checker itself -------------------------------------------------------------
    Mutant("checker ignores reads", "driver/sim/_checker.py",
           "        self.checks += 1\n        if n <= 0:", "        self.checks += 1\n        if n <= 0 or kind == 'read':",
           ("cuda",)),
    Mutant("checker ignores use after free", "driver/sim/_checker.py",
           "                if rec.kind == \"free\" and kind not in (\"alloc\", \"free\"):",
           "                if False:", ("cuda",)),
    Mutant("checker ignores unordered writes", "driver/sim/_checker.py",
           "                elif clock.get(rec.uid, 0) < rec.seq and not (rec.kind == \"read\" and kind == \"read\"):",
           "                elif clock.get(rec.uid, 0) < rec.seq and rec.kind == \"alloc\":", ("cuda",)),
    Mutant("event waits do not order (false races)", "driver/sim/_streams.py",
           "            prepared = self._next(s, extra_deps=(e.op,), extra_clock=e.clock)",
           "            prepared = self._next(s, extra_deps=(e.op,))", ("cuda",)),
]
