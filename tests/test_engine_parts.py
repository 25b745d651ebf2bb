"""The arena's lock and its miss table, on both builds: the compiled ``_hotc.Lock`` behaves as the
``threading.RLock`` the Python build uses, and ``_hotc.Misses`` answers as ``_hot.Misses``."""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

import mrkit
from mrkit._engine import _hot, core_name
from mrkit.driver import SimDriver

try:
    from mrkit._engine import _hotc
except ImportError:
    _hotc = None

compiled = pytest.mark.skipif(_hotc is None, reason="the compiled core is not built here")
LOCKS = [pytest.param(threading.RLock, id="python"),
         pytest.param(getattr(_hotc, "Lock", None), id="compiled", marks=compiled)]


def _one_mib_pool(sim, core):
    """A pool of exactly 1 MiB on the build ``core`` ("compiled" skips where it is not built)."""
    if core == "compiled" and _hotc is None:
        pytest.skip("the compiled core is not built here")
    import contextlib
    from mrkit._engine import python_core
    with python_core() if core == "python" else contextlib.nullcontext():
        return mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=sim), initial_size=1 << 20,
                                  maximum_size=1 << 20)


@pytest.mark.parametrize("make", LOCKS)
def test_the_lock_behaves_as_threading_rlock(make):
    lk = make()
    assert not lk._is_owned()
    assert lk.acquire() is True and lk._is_owned()
    assert lk.acquire(False) is True  # reentrant for its holder
    lk.release()
    assert lk._is_owned()
    other = []
    t = threading.Thread(target=lambda: other.append((lk.acquire(False), lk.acquire(True, 0.01), lk._is_owned())))
    t.start()
    t.join(10)
    assert other == [(False, False, False)]  # another thread neither gets it nor owns it
    with pytest.raises(ValueError):
        lk.acquire(False, 1.0)
    lk.release()
    assert not lk._is_owned()
    with pytest.raises(RuntimeError):
        lk.release()
    with lk:
        assert lk._is_owned()
        with lk:
            assert lk._is_owned()
        assert lk._is_owned()
    assert not lk._is_owned()
    assert lk.acquire(timeout=0.5) is True
    lk.release()


@pytest.mark.parametrize("make", LOCKS)
def test_the_lock_excludes_other_threads_and_lets_them_run_while_they_wait(make):
    """Eight threads add to a counter in read-modify-write steps that yield the GIL between read and
    write: under the lock no update is lost, and a waiting thread does not block the holder (the
    wait releases the GIL, else this would deadlock)."""
    lk, box, n = make(), [0], 200

    def work():
        for _ in range(n):
            with lk:
                v = box[0]
                time.sleep(0)  # another thread runs here, and must wait for the lock
                box[0] = v + 1

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts)
    assert box[0] == 8 * n and not lk._is_owned()


@pytest.mark.parametrize("make", LOCKS)
def test_the_lock_under_contention_with_timed_waits(make):
    """Six threads mix blocking and timed acquisitions (some time out while the lock is held): every
    update made under the lock survives, a timed wait lasts about its timeout, a waiter that gave up
    leaves no stale wakeup that lets two threads in, and the lock ends free."""
    lk, box, got, n = make(), [0], [0] * 6, 300
    inside = []

    def work(k):
        for i in range(n):
            ok = lk.acquire(timeout=0.0005) if (i + k) % 3 == 0 else lk.acquire()
            if not ok:
                continue
            try:
                inside.append(k)
                assert len(inside) == 1, "two threads hold the lock"
                v = box[0]
                time.sleep(0)
                box[0] = v + 1
                got[k] += 1
                inside.pop()
            finally:
                lk.release()

    ts = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(6)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 20
    for t in ts:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in ts), "a thread still waits for a lock nobody holds"
    assert box[0] == sum(got) and sum(got) >= 4 * n and not lk._is_owned()
    lk.acquire()
    out = []
    t = threading.Thread(target=lambda: out.append((time.monotonic(), lk.acquire(timeout=0.05), time.monotonic())))
    t.start()
    t.join(10)
    lk.release()
    (t0, ok, t1), = out
    assert ok is False and t1 - t0 >= 0.04
    assert lk.acquire(False) is True  # free, and taken at once
    lk.release()


@compiled
def test_a_compiled_arena_holds_its_lock_through_a_resource_call():
    """The compiled paths take the arena's C lock: a thread that holds it from Python makes another
    thread's allocation wait until it is released."""
    pool = mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=SimDriver()))
    if core_name() != "compiled":
        pytest.skip("MRKIT_NO_EXTENSIONS is set: arenas run the Python build")
    assert isinstance(pool.arena.lock, _hotc.Lock)
    got = []
    with pool.arena.lock:
        t = threading.Thread(target=lambda: got.append(pool.allocate(1 << 20, mrkit.DEFAULT_STREAM)))
        t.start()
        t.join(0.2)
        assert t.is_alive() and not got  # waiting for the lock (a miss takes it)
    t.join(10)
    assert len(got) == 1
    pool.deallocate(got[0], 1 << 20, mrkit.DEFAULT_STREAM)
    pool.release()
    assert pool.pool_size == 0


@compiled
@settings(max_examples=150, deadline=None)
@given(st.integers(1, 16), st.integers(2, 12), st.integers(1, 3), st.integers(0, 41), st.integers(0, 16),
       st.lists(st.integers(0, 40), min_size=1, max_size=300))
def test_the_compiled_miss_table_answers_as_the_python_one(distance, capacity, repeats, small, small_distance, sizes):
    """The compiled table is a hash table with open addressing: among 41 sizes in a table of 16 or
    32 slots, sizes share home slots, so entries that probed past others, and a table emptied while
    one of them misses again, are exercised; with 1 to 3 repeats needed before a size is hot, and the
    sizes up to ``small`` judged by their own distance."""
    py = _hot.Misses(distance, capacity, repeats, small << 8, small_distance)
    cc = _hotc.Misses(distance, capacity, repeats, small << 8, small_distance)
    for s in sizes:
        assert cc.note(s << 8) == py.note(s << 8), s
        assert cc.count == py.count and cc.last == py.last


@compiled
def test_the_compiled_miss_table_keeps_a_size_that_probed_past_another_when_it_starts_afresh():
    """``b`` misses again too late while the table is full: the table starts afresh holding only ``b``,
    which must then be found (its next miss is within the distance). Every ordered pair of 40 sizes
    is tried, so pairs that share a home slot in the 16-slot table (``b`` probed past ``a``) are among
    them."""
    for a in range(40):
        for b in range(40):
            if a == b:
                continue
            py, cc = _hot.Misses(2, 2), _hotc.Misses(2, 2)
            for size in (a, b, a, a, b, b):
                assert cc.note(size << 8) == py.note(size << 8), (a, b)
            assert cc.last == py.last


@pytest.mark.parametrize("make", [pytest.param(_hot.Misses, id="python"),
                                  pytest.param(getattr(_hotc, "Misses", None), id="compiled", marks=compiled)])
def test_a_size_is_hot_when_it_misses_again_within_the_distance(make):
    m = make(3, 100)
    assert not m.note(256)          # first miss
    assert m.note(256)              # again at once
    for s in (512, 768, 1024):
        m.note(s)
    assert not m.note(256)          # four misses later: too far
    m = make(100, 2)
    m.note(256), m.note(512)
    assert not m.note(768) and len(m.last) == 1  # full: starts afresh
    assert not m.note(256)          # forgotten


@pytest.mark.parametrize("make", [pytest.param(_hot.Misses, id="python"),
                                  pytest.param(getattr(_hotc, "Misses", None), id="compiled", marks=compiled)])
def test_sizes_up_to_small_are_judged_by_their_own_distance(make):
    """The VMM's rule (``ChunkSource.hot_small``): a size of at most ``small`` bytes is hot when it
    misses again within ``small_distance``; a larger one only within ``distance``."""
    m = make(2, 100, 1, 4096, 10)
    for size, hot in ((4096, True), (4352, False)):
        assert not m.note(size)
        for s in range(1, 6):  # five other sizes missed in between: past 2, within 10
            m.note(size + (s << 20))
        assert m.note(size) is hot, size
    with pytest.raises(ValueError, match="small and small_distance must be >= 0"):
        make(2, 100, 1, -1, 10)


@pytest.mark.parametrize("make", [pytest.param(_hot.Misses, id="python"),
                                  pytest.param(getattr(_hotc, "Misses", None), id="compiled", marks=compiled)])
def test_with_two_repeats_a_size_is_hot_on_its_third_miss_in_a_row(make):
    """The arena's rule (``HOT_REPEATS``): a size that came back once within the distance by chance
    is not hot; one that keeps coming back is, and a miss too far apart starts its count again."""
    m = make(3, 100, 2)
    assert not m.note(256) and not m.note(256)  # the first miss, then one repeat
    assert m.note(256)              # the second repeat in a row
    assert m.note(256)              # and it stays hot while it keeps coming back
    for s in (512, 768, 1024):
        m.note(s)
    assert not m.note(256)          # too far: the count starts again
    assert not m.note(256) and m.note(256)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        make(3, 100, 0)


@compiled
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "discard", "in"]), st.integers(0, 12)), max_size=80))
def test_the_compiled_chunk_bases_answer_as_a_set(steps):
    """``_hotc.Boundaries`` (the compiled arena's chunk bases) behaves as the Python build's ``set`` for
    every operation the engine makes, and the free list asks it without a Python int."""
    py, cc = set(), _hotc.Boundaries()
    for op, k in steps:
        b = k << 20
        if op == "in":
            assert (b in cc) == (b in py)
        else:
            getattr(py, op)(b), getattr(cc, op)(b)
        assert len(cc) == len(py) and sorted(cc) == sorted(py)
    assert (-1 in cc) is False and ((1 << 70) in cc) is False  # no int outside 64 bits is a base


@pytest.mark.parametrize("bases", [set, getattr(_hotc, "Boundaries", None)], ids=["set", "Boundaries"])
@compiled
def test_the_compiled_free_list_never_coalesces_across_a_chunk_base(bases):
    fl = _hotc.FreeList()
    b = bases([1 << 20])
    fl.insert((1 << 20) - 4096, 4096, b)  # ends at the base
    fl.insert(1 << 20, 4096, b)           # starts at it: two blocks
    fl.insert((1 << 20) + 4096, 4096, b)  # joins the second only
    assert fl.items() == [((1 << 20) - 4096, 4096), (1 << 20, 8192)]
    b.discard(1 << 20)
    fl.remove((1 << 20) - 4096, 4096)
    fl.insert((1 << 20) - 4096, 4096, b)  # no base any more: the two are one block
    assert fl.items() == [((1 << 20) - 4096, 12288)]


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_a_stream_whose_state_was_retired_gets_a_new_one_and_loses_nothing(sim, core):
    """A stream mrkit cannot prove alive (a raw handle) has its state retired by ``release()``; the same
    stream object used again gets a new state, never the retired one (the compiled paths keep the
    last state they found), and every byte goes back upstream."""
    if core == "compiled" and _hotc is None:
        pytest.skip("the compiled core is not built here")
    import contextlib
    from mrkit._engine import python_core
    with python_core() if core == "python" else contextlib.nullcontext():
        upstream = mrkit.DeviceMemoryResource(0, driver=sim)
        pool = mrkit.PoolResource(upstream)
    s = mrkit.Stream.wrap(sim.stream_create(0), driver=sim)
    assert s.alive is None
    for round_ in range(3):
        for n in (4096, 4096, 4096, 70000, 70000, 123456):  # repeated sizes turn hot: cached blocks
            pool.deallocate(pool.allocate(n, s), n, s)
        old = pool.arena.states[s.uid]
        pool.release()
        assert s.uid not in pool.arena.states and old.cache is None  # retired
        live = [(pool.allocate(n, s), n) for n in (4096, 70000, 5000)]
        assert pool.arena.states[s.uid] is not old
        for p, n in live:
            pool.deallocate(p, n, s)
        assert pool.arena.live == {}
    pool.release()
    assert pool.pool_size == 0 and upstream.live_bytes == 0


def _cached_somewhere(st) -> bool:
    cache = st.cache
    return bool(cache) and any(cache.values())


@pytest.mark.skipif(core_name() != "compiled", reason="the arenas here are the Python build's "
                    "(MRKIT_NO_EXTENSIONS=1 or no compiled core), which keep no hint")
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["pool", "vmm"]),
       st.lists(st.tuples(st.booleans(), st.sampled_from([256, 512, 4096, 4096, 70000, 1 << 20, 3 << 20]),
                          st.integers(0, 1), st.integers(0, 50)), min_size=1, max_size=120))
def test_a_block_in_any_cache_list_is_flagged(kind, steps):
    """The compiled build skips the walk over a state's cache lists while its ``maybe_cached`` hint is
    false: after every operation (hits, misses, frees into the cache lock-free and under the lock,
    flushes that serve a miss, sizes hot again, releases), every state holding a cached block has the
    hint set. The pool's upstream is small, so misses flush the cache to be served."""
    from mrkit.driver import SimDeviceSpec
    drv = SimDriver([SimDeviceSpec(total_memory=16 << 20)])
    if kind == "pool":
        mr = mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=drv), initial_size=4 << 20,
                                maximum_size=12 << 20)
    else:
        mrkit.driver.set_backend(drv)
        mr = mrkit.VirtualMemoryResource(0)
    streams = [mrkit.DEFAULT_STREAM, mrkit.Stream.create(0, driver=drv)]
    live = []
    for alloc, n, s, k in steps:
        if alloc or not live:
            try:
                live.append((mr.allocate(n, streams[s]), n, s))
            except MemoryError:
                mr.release() if k % 3 == 0 else None
        else:
            p, m, s0 = live.pop(k % len(live))
            mr.deallocate(p, m, streams[s0])
        for state in mr.arena.states.values():
            assert state.maybe_cached or not _cached_somewhere(state)
    for p, m, s0 in live:
        mr.deallocate(p, m, streams[s0])
    mr.release()
    assert mr.arena.live == {}


@pytest.mark.parametrize("how", ["locked", "deferred"])
@pytest.mark.parametrize("core", ["compiled", "python"])
def test_a_size_hot_again_after_a_flush_is_cached_and_flagged(sim, core, how):
    """A flush that serves a miss remembers the hot sizes; the next free of one is cached under the
    lock (the size is hot again), and the state says it may hold a cached block. ``deferred``: the
    free finds the lock taken (rule 8) and is applied by the next locked step."""
    pool = _one_mib_pool(sim, core)
    s = mrkit.DEFAULT_STREAM
    for _ in range(3):  # misses twice: hot
        pool.deallocate(pool.allocate(4096, s), 4096, s)
    p, q = pool.allocate(4096, s), pool.allocate(4096, s)
    pool.deallocate(q, 4096, s)
    st_ = pool.arena.states[s.uid]
    assert st_.cache[4096] == [q]
    big = pool.allocate((1 << 20) - 4096, s)  # all but p: the cache is flushed to serve it
    assert not _cached_somewhere(st_) and 4096 in st_.rehot
    st_.maybe_cached = False
    if how == "locked":
        pool.deallocate(p, 4096, s)  # no list in the new cache lock-free; under the lock, hot again
    else:
        with pool.arena.lock:
            pool.deallocate(p, 4096, s)
        assert [d[0] for d in pool.arena.deferred] == [p]
    pool.deallocate(big, (1 << 20) - 4096, s)  # a locked step: it applies the deferred free too
    assert not pool.arena.deferred
    assert st_.cache[4096] == [p]
    assert st_.maybe_cached or core == "python"  # the Python build walks the lists (no hint)
    pool.release()


@pytest.mark.skipif(core_name() != "compiled", reason="the compiled core is not built here")
def test_cache_hits_hold_each_pointer_once(sim):
    """The compiled build pops a cache list without shrinking its storage (not ``list.pop``): the
    list's reference to a popped pointer passes to the caller, none is lost (a crash later) or kept
    (a leak). A pointer from a miss or a hit is held by the caller only (the live table keeps the
    address as a C value); a cached one by its list only."""
    import sys
    pool, s = mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=sim)), mrkit.DEFAULT_STREAM
    counts = []
    for n in (4096, 4096, 4096, 4096, 70000, 70000, 70000):  # misses, then hits once the size is hot
        p = pool.allocate(n, s)
        counts.append(sys.getrefcount(p) - 1)  # less getrefcount's own argument
        pool.deallocate(p, n, s)
        del p
    assert counts == [1] * 7 and type(pool.arena.live).__name__ == "AddressTable"
    held = [pool.allocate(4096, s) for _ in range(3)]
    for n in held:
        pool.deallocate(n, 4096, s)
    del held, n
    cached = pool.arena.states[s.uid].cache[4096]
    assert len(cached) == 3 and [sys.getrefcount(p) - 1 for p in cached] == [2, 2, 2]  # the list, p
    again = pool.allocate(4096, s)
    assert sys.getrefcount(again) - 1 == 1 and len(cached) == 2  # the caller's: the list's passed to it
    pool.deallocate(again, 4096, s)
    pool.release()


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_a_free_after_a_flush_never_lands_in_the_old_cache_list(sim, core):
    """The compiled paths remember the last cache list they found, by the cache dict's identity: a
    flush swaps the dict, so the next free of that size goes to the new dict's list (or the free list),
    never to the detached one, and every byte goes back upstream."""
    if core == "compiled" and _hotc is None:
        pytest.skip("the compiled core is not built here")
    import contextlib
    from mrkit._engine import python_core
    with python_core() if core == "python" else contextlib.nullcontext():
        upstream = mrkit.DeviceMemoryResource(0, driver=sim)
        pool = mrkit.PoolResource(upstream)
    s, n = mrkit.DEFAULT_STREAM, 4096
    for _ in range(4):  # hot, then hits and frees through the remembered list
        pool.deallocate(pool.allocate(n, s), n, s)
    st_ = pool.arena.states[s.uid]
    old = st_.cache[n]
    p = pool.allocate(n, s)
    with pool.arena.lock:
        st_.flush(pool.arena.boundaries, keep=True)  # a new dict, with a new (empty) list for n
    assert st_.cache[n] is not old
    pool.deallocate(p, n, s)
    assert old == [] and st_.cache[n] == [p]
    q = pool.allocate(n, s)
    assert q == p and st_.cache[n] == []
    pool.deallocate(q, n, s)
    pool.release()
    assert pool.pool_size == 0 and upstream.live_bytes == 0


@compiled
def test_the_compiled_constants_are_the_arenas():
    """The compiled paths keep their own copies of the arena's constants (C fields): they must agree."""
    from mrkit._engine import _arena
    assert _hotc.CONSTANTS == {"_CACHE_WINDOW": _arena._CACHE_WINDOW, "MAX_HOT": _arena.MAX_HOT}


@pytest.mark.parametrize("core", ["compiled", "python"])
def test_a_miss_sees_a_size_made_hot_by_python_code_after_it_last_looked(sim, core):
    """The compiled miss looks at the hot sizes through an index of the cache that it keeps between
    misses; a size made hot by the arena's Python code in between (``StreamState.register``, as a
    deferred free hot again after a flush does) must be in it: a smaller miss takes that size's
    cached block, as the Python build does."""
    pool = _one_mib_pool(sim, core)
    s = mrkit.DEFAULT_STREAM
    for _ in range(3):  # 8 KiB misses twice: hot
        pool.deallocate(pool.allocate(8192, s), 8192, s)
    a = pool.allocate(1024, s)  # a miss that looks at the hot sizes (the compiled build indexes them)
    st_ = pool.arena.states[s.uid]
    with pool.arena.lock:
        st_.register(4096, pool.arena.boundaries)  # the Python code's register
    q = pool.allocate(4096, s)  # cut from the free list
    pool.deallocate(q, 4096, s)  # into 4 KiB's cache list, lock-free
    assert st_.cache[4096] == [q]
    b = pool.allocate(2048, s)  # fits the cached 4 KiB block better than the free list's best
    assert b == q and st_.cache[4096] == []
    for p, n in ((a, 1024), (b, 2048)):
        pool.deallocate(p, n, s)
    pool.release()
    assert pool.pool_size == 0


@pytest.mark.skipif(core_name() != "compiled", reason="the compiled core is not built or not in use here")
def test_the_c_hooks_called_from_c_serve_repeat_sizes_and_zero(sim):
    """CuPy's C route (``CHooks.addresses``) called from C: a repeated size is served from the cache
    with the size remembered between calls, a zero-byte request on hooks that remember nothing yet
    gets a null pointer, and every block goes home."""
    import ctypes
    from mrkit._engine import c_hooks
    from mrkit.cupy import AllocatorHooks
    pool = mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=sim))
    stream = mrkit.Stream.create(driver=sim)
    hooks = AllocatorHooks(pool, lambda device: stream)
    ch = c_hooks(hooks.table, hooks.bind, [], [False], [0, 0])
    param, m_addr, f_addr = ch.addresses
    malloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(m_addr)
    free = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(f_addr)
    assert not malloc(param, 0, 0) and pool.live_bytes == 0  # nothing remembered: the memo is not used
    got = []
    for n in (1024, 1024, 1024, 4096, 1024):
        p = malloc(param, n, 0)
        assert p and pool.live_bytes == n
        got.append(p)
        free(param, p, 0)
    assert got[1] == got[2] == got[4]  # 1 KiB is hot after its second miss: the cache serves it
    assert not malloc(param, 0, 0) and pool.live_bytes == 0
    assert pool.arena.live == {} and not hooks.table[0][3].where
    stream.close()


def test_hooks_over_one_resource_bind_its_own_device_and_name_the_other(sim):
    """``AllocatorHooks(mr).bind(device)``: the hooks of ``mr``'s own device (bound at construction),
    not an error that names the same device twice; another device is a ValueError naming both."""
    from mrkit.cupy import AllocatorHooks
    pool = mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=sim))
    hooks = AllocatorHooks(pool)
    assert hooks.bind(0) is hooks.table[0] is hooks.hooks(0)
    with pytest.raises(ValueError, match=r"device is 1, but this allocator serves device 0"):
        hooks.bind(1)
    m, f, _, _ = hooks.bind(0)
    f(m(512, 0), 0)
    assert pool.live_bytes == 0
