"""mrkit.statistics: scopes, the profiler and its report (issue: see where the memory went)."""
from __future__ import annotations

import threading

import pytest

import mrkit
import mrkit.statistics as ms
from mrkit import DEFAULT_STREAM, PoolResource, CudaMemoryResource


@pytest.fixture
def pool(sim):
    mr = PoolResource(CudaMemoryResource(driver=sim))
    mrkit.set_current_resource(mr)
    ms.reset_profiler()
    yield mr
    ms.reset_profiler()


def test_enable_statistics_wraps_the_current_resource_once(pool):
    a = ms.enable_statistics()
    assert isinstance(a, mrkit.StatisticsAdaptor) and a.upstream is pool
    assert ms.enable_statistics() is a and mrkit.get_current_resource() is a
    assert ms.get_statistics().current_bytes == 0


def test_nested_scopes_each_see_their_own_peak(pool):
    mr = ms.enable_statistics()
    before = mr.allocate(10_000, DEFAULT_STREAM)  # live when the scopes open: not counted in them
    with ms.statistics() as outer:
        a = mr.allocate(1000, DEFAULT_STREAM)
        with ms.statistics() as inner:
            b = mr.allocate(5000, DEFAULT_STREAM)
            assert inner.current_bytes == 5000
            mr.deallocate(b, 5000, DEFAULT_STREAM)
        mr.deallocate(a, 1000, DEFAULT_STREAM)
        c = mr.allocate(300, DEFAULT_STREAM)
    assert (inner.peak_bytes, inner.total_count, inner.current_bytes) == (5000, 1, 0)
    assert (outer.peak_bytes, outer.total_count, outer.total_bytes, outer.current_bytes) == (6000, 3, 6300, 300)
    mr.deallocate(c, 300, DEFAULT_STREAM)
    mr.deallocate(before, 10_000, DEFAULT_STREAM)
    assert mr.statistics.current_bytes == 0


def test_profiler_decorator_and_context_and_report(pool):
    mr = ms.enable_statistics()

    @ms.profiler(name="step")
    def step(n):
        p = mr.allocate(n, DEFAULT_STREAM)
        q = mr.allocate(n, DEFAULT_STREAM)
        mr.deallocate(p, n, DEFAULT_STREAM)
        mr.deallocate(q, n, DEFAULT_STREAM)
        return n

    assert step(1000) == 1000 and step(4000) == 4000
    with ms.profiler("load"):
        p = mr.allocate(1 << 20, DEFAULT_STREAM)
        mr.deallocate(p, 1 << 20, DEFAULT_STREAM)
    recs = ms.profiler_records()
    assert (recs["step"].calls, recs["step"].allocations, recs["step"].total_bytes, recs["step"].peak_bytes) == (
        2, 4, 10_000, 8000)
    assert (recs["load"].calls, recs["load"].peak_bytes) == (1, 1 << 20)
    table = ms.report()
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["name", "calls", "allocations"]
    assert lines[2].startswith("load") and lines[3].startswith("step")  # largest total first
    assert ms.report("calls").splitlines()[2].startswith("step")
    with pytest.raises(ValueError, match="sort_by"):
        ms.report("bogus")


def test_profiler_default_names_and_exceptions(pool):
    mr = ms.enable_statistics()

    @ms.profiler()
    def boom():
        mr.allocate(512, DEFAULT_STREAM)
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        boom()
    (name,) = ms.profiler_records()
    assert name.startswith("test_profiler_default_names_and_exceptions.<locals>.boom (") and __file__ in name
    assert ms.profiler_records()[name].allocations == 1
    with pytest.raises(TypeError, match="name"):
        ms.profiler(5)


def test_scopes_count_allocations_from_every_thread(pool):
    mr = ms.enable_statistics()
    with ms.statistics() as s:
        def work():
            for _ in range(500):
                p = mr.allocate(256, DEFAULT_STREAM)
                mr.deallocate(p, 256, DEFAULT_STREAM)
        ts = [threading.Thread(target=work) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert (s.total_count, s.total_bytes, s.current_bytes) == (4000, 4000 * 256, 0)
    assert 256 <= s.peak_bytes <= 8 * 256
