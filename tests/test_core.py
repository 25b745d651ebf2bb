"""The two builds of the engine's hot path (compiled ``_hotc``, Python ``_hot``) have one semantics,
and the build in use is visible."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import mrkit
from mrkit import DeviceMemoryResource, PoolResource, StatisticsAdaptor, Stream
from mrkit._engine import core_name, python_core

compiled = pytest.mark.skipif(core_name() != "compiled", reason="the compiled core is not built here "
                              "(no C++ compiler at install time, or MRKIT_NO_EXTENSIONS=1)")


def _run(env_extra) -> str:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-m", "mrkit", "info"], env=env, capture_output=True, text=True,
                          check=True).stdout


def test_info_names_the_core_and_the_switch_forces_python():
    assert "core: python (MRKIT_NO_EXTENSIONS is set)" in _run({"MRKIT_NO_EXTENSIONS": "1"})
    import importlib.util
    built = importlib.util.find_spec("mrkit._engine._hotc") is not None
    line = next(ln for ln in _run({"MRKIT_NO_EXTENSIONS": "0"}).splitlines() if ln.startswith("core:"))
    assert line.startswith("core: compiled" if built else "core: python (the extension is not built")


def test_python_core_builds_python_paths(sim):
    with python_core():
        assert core_name() == "python"
        pool = PoolResource(DeviceMemoryResource())
    assert pool.allocate.__code__.co_filename.endswith(os.path.join("_engine", "_hot.py"))


ops = st.lists(st.tuples(st.sampled_from(["a", "f", "f", "trim", "bad"]), st.integers(0, 9),
                         st.sampled_from([0, 1, 255, 256, 4096, 5000, 1 << 20]), st.integers(0, 1)),
               min_size=1, max_size=60)


def _trace(make, steps):
    """What a resource answers to ``steps``: pointers, errors and held bytes after each."""
    from mrkit.driver import SimDriver, set_backend
    drv = SimDriver()
    set_backend(drv)
    mr = make()
    streams = [mrkit.DEFAULT_STREAM, Stream.create(0, driver=drv)]
    live, out = [], []
    for op, i, n, s in steps:
        try:
            if op == "a":
                p = mr.allocate(n, streams[s])
                live.append((p, n, s))
                out.append(("a", p))
            elif op == "f" and live:
                p, m, s0 = live.pop(i % len(live))
                mr.deallocate(p, m, streams[s0])
                out.append(("f", p))
            elif op == "trim":
                mr.trim() if hasattr(mr, "trim") else mr.upstream.trim()
                out.append(("t",))
            elif op == "bad":
                mr.deallocate(0xdead00, n or 1, streams[s])
        except (ValueError, TypeError, MemoryError) as exc:
            out.append((type(exc).__name__,))
        out.append(mr.live_bytes if hasattr(mr, "live_bytes") else mr.upstream.live_bytes)
    for p, m, s0 in live:
        mr.deallocate(p, m, streams[s0])
    return out


@compiled
@settings(max_examples=60, deadline=None)
@given(ops)
def test_both_builds_answer_alike(steps):
    for make in (lambda: PoolResource(DeviceMemoryResource()),
                 lambda: StatisticsAdaptor(PoolResource(DeviceMemoryResource()))):
        got = _trace(make, steps)
        with python_core():
            want = _trace(make, steps)
        assert got == want


def _random_trace(make, seed, ops=1500, sizes=None, nstreams=2):
    """Where (chunk, offset) a resource places its blocks over a random workload on two streams: sizes from a small set
    (they turn hot and are cached) and random ones (best fit and coalescing on every call); ``sizes``: every
    size drawn from that list instead (with more sizes than a stream may cache, the cache starts afresh)."""
    import random
    from mrkit.driver import SimDeviceSpec, SimDriver, set_backend
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=16 << 30)])
    set_backend(drv)
    mr = make()
    streams = [mrkit.DEFAULT_STREAM, Stream.create(0, driver=drv)]
    rng, live, out = random.Random(seed), [], []
    for _ in range(ops):
        if rng.random() < 0.52 or not live:
            if sizes is not None:
                n = rng.choice(sizes)
            else:
                n = rng.choice([512, 4096, 70000]) if rng.random() < 0.4 else rng.randint(1, 4 << 20)
            s = rng.randrange(nstreams)
            live.append((mr.allocate(n, streams[s]), n, s))
            out.append(live[-1][0])
        else:
            p, n, s = live.pop(rng.randrange(len(live)))
            mr.deallocate(p, n, streams[s])
    for p, n, s in live:
        mr.deallocate(p, n, streams[s])
    mr = mr.upstream if isinstance(mr, StatisticsAdaptor) else mr
    chunks = list(mr.arena.chunks.items())  # in the order they were made; none went back meanwhile
    return [next((i, p - c) for i, (c, size) in enumerate(chunks) if c <= p < c + size) for p in out], mr


@compiled
@pytest.mark.parametrize("make", [lambda: PoolResource(DeviceMemoryResource()),
                                  lambda: StatisticsAdaptor(PoolResource(DeviceMemoryResource())),
                                  lambda: mrkit.VirtualMemoryResource(0)],
                         ids=["pool", "counting pool", "vmm"])
def test_the_compiled_miss_path_places_every_block_where_the_python_one_does(make):
    """The locked miss path (best fit, the free list, cache registration, frees into the free list) is
    compiled in the compiled build: the same workload gets the same pointers from both builds, and
    every byte is free again at the end."""
    from mrkit._engine import _hotc
    for seed in (1, 2):
        got, mr = _random_trace(make, seed)
        assert all(type(st.free) is _hotc.FreeList for st in mr.arena.states.values())
        with python_core():
            want, py = _random_trace(make, seed)
        assert type(next(iter(py.arena.states.values())).free) is not _hotc.FreeList
        assert got == want
        assert mr.arena.live == {} and mr.arena.free_total() == mr.arena.held


@compiled
@pytest.mark.parametrize("make, full", [(lambda: PoolResource(DeviceMemoryResource(), initial_size=8 << 30), True),
                                        (lambda: mrkit.VirtualMemoryResource(0), False)], ids=["pool", "vmm"])
def test_both_builds_place_alike_when_more_sizes_turn_hot_than_a_stream_caches(make, full):
    """1 200 sizes that recur (30 000 operations: a size turns hot on its third miss in a row within
    ``HOT_DISTANCE``), on one stream with room to spare (no miss finds the free list short):
    in the pool more sizes turn hot than ``MAX_HOT``, so registering one starts the cache afresh (the
    compiled ``register``), and a miss looks at many cached sizes (the compiled index of the cache); the
    VMM (hot within 64 misses, its cache coalesced by its placement) flushes on its own. The same
    pointers from both builds, and every byte free again at the end."""
    import random
    from mrkit._engine import _arena
    rng = random.Random(7)
    sizes = sorted({rng.randint(1, 1 << 14) * 256 - rng.randrange(256) for _ in range(1200)})
    flushes = []
    real_flush = _arena._StateMethods.flush

    def counted(st, *args, **kw):
        flushes.append(len(st.hot) >= _arena.MAX_HOT)
        return real_flush(st, *args, **kw)
    _arena._StateMethods.flush = counted
    try:
        got, mr = _random_trace(make, 3, ops=30000, sizes=sizes, nstreams=1)
        with python_core():
            want, _ = _random_trace(make, 3, ops=30000, sizes=sizes, nstreams=1)
    finally:
        _arena._StateMethods.flush = real_flush
    assert got == want
    assert any(flushes) == full, "a stream reached MAX_HOT hot sizes" if not full else "none did"
    assert mr.arena.live == {} and mr.arena.free_total() == mr.arena.held


@compiled
def test_the_rounding_entry_rounds_in_c_and_keeps_attributes():
    """The compiled allocator entry in front of CuPy's C route: ``call(size)`` is ``inner(size rounded
    up to the unit)``, it carries attributes of its own, and a size that is not an int is a TypeError
    naming the type (CuPy passes ints)."""
    from mrkit._engine import rounding_call
    seen = []
    call = rounding_call(lambda n: seen.append(n) or n, 512)
    assert [call(n) for n in (0, 1, 511, 512, 513, 1 << 40)] == [0, 512, 512, 512, 1024, 1 << 40]
    assert seen == [0, 512, 512, 512, 1024, 1 << 40] and call.rounding == 512
    call.hooks = "h"
    assert call.hooks == "h"
    with pytest.raises(TypeError, match="float"):
        call(1.5)
    assert len(seen) == 6
