"""Adaptors: exact statistics arithmetic, logs and replay, limits under threads, tracking, retry."""
from __future__ import annotations

import io
import threading

import pytest

from mrkit import (
    DEFAULT_STREAM, CudaMemoryResource, HostMemoryResource, LimitingAdaptor, LoggingAdaptor,
    OutOfMemoryError, PoolResource, RetryAdaptor, Statistics, StatisticsAdaptor, Stream, TrackingAdaptor,
    read_log, replay,
)

S = DEFAULT_STREAM


# the adaptor's own methods (host upstream) and its hot path fused into a pool's
UPSTREAMS = pytest.mark.parametrize("upstream", [HostMemoryResource, lambda: PoolResource(HostMemoryResource())],
                                    ids=["methods", "fused-into-pool"])


@UPSTREAMS
def test_statistics_arithmetic_is_exact(upstream):
    mr = StatisticsAdaptor(upstream())
    a = mr.allocate(100, S)
    b = mr.allocate(50, S)
    mr.deallocate(a, 100, S)
    assert mr.statistics == Statistics(50, 150, 150, 1, 2, 2)
    assert mr.allocate(0, S) == 0 and mr.statistics.total_count == 2  # zero-size is not counted
    mr.push_counters()
    c = mr.allocate(30, S)
    d = mr.allocate(20, S)
    mr.deallocate(b, 50, S)  # allocated below, freed inside: a negative delta in this frame
    assert mr.statistics == Statistics(0, 50, 50, 1, 2, 2)
    popped = mr.pop_counters()
    assert popped == Statistics(0, 50, 50, 1, 2, 2)
    # folded in: current 50 + 0, peak max(150, 50 + 50), totals add
    assert mr.statistics == Statistics(50, 150, 200, 2, 3, 4)
    mr.push_counters()
    mr.deallocate(c, 30, S)
    mr.deallocate(d, 20, S)
    assert mr.pop_counters() == Statistics(-50, 0, 0, -2, 0, 0)
    assert mr.statistics == Statistics(0, 150, 200, 0, 3, 4)
    mr.reset_peak()
    assert mr.statistics.peak_bytes == 0
    with pytest.raises(ValueError, match="no frame"):
        mr.pop_counters()


@UPSTREAMS
def test_statistics_stay_exact_under_eight_threads(upstream):
    import sys
    mr = StatisticsAdaptor(upstream())
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work():
        for i in range(700):
            p = mr.allocate(64 + i % 5, S)
            mr.deallocate(p, 64 + i % 5, S)

    try:
        ts = [threading.Thread(target=work) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    st = mr.statistics
    assert (st.current_bytes, st.current_count, st.total_count) == (0, 0, 8 * 700)
    assert st.total_bytes == 8 * sum(64 + i % 5 for i in range(700))
    assert 64 <= st.peak_bytes <= 8 * 68 and 1 <= st.peak_count <= 8


def test_statistics_fold_in_batches_is_exact():
    """The numpy fold of a large batch gives what the event-by-event fold gives."""
    import random

    from mrkit.adaptors._statistics import _fold_array, _fold_loop
    rng = random.Random(3)
    for trial in range(30):
        live, batch = [], []
        for _ in range(rng.randrange(1, 3000)):
            if live and rng.random() < 0.5:
                batch.append(-live.pop(rng.randrange(len(live))))
            else:
                live.append(rng.randrange(1, 1 << 40))
                batch.append(live[-1])
        start = tuple(rng.randrange(-5, 50) for _ in range(6))
        assert _fold_array(batch, *start) == _fold_loop(batch, *start), trial


def test_fused_statistics_count_only_calls_through_the_adaptor():
    pool = PoolResource(HostMemoryResource())
    mr = StatisticsAdaptor(pool)
    assert "allocate" in vars(mr)  # fused into the pool's hot path
    direct = pool.allocate(1000, S)  # not through the adaptor: not counted
    p = mr.allocate(512, S)
    assert mr.statistics == Statistics(512, 512, 512, 1, 1, 1)
    for _ in range(5000):  # more than a fold's worth of events
        mr.deallocate(mr.allocate(256, S), 256, S)
    mr.deallocate(p, 512, S)
    pool.deallocate(direct, 1000, S)
    assert mr.statistics == Statistics(0, 768, 512 + 5000 * 256, 0, 2, 5001)
    with pytest.raises(ValueError):  # a bad free through the fused path is refused and not counted
        mr.deallocate(p, 512, S)
    assert mr.statistics.current_bytes == 0

    class Custom(PoolResource):  # an overridden hot path is called, never bypassed
        calls = 0

        def allocate(self, nbytes, stream, alignment=256):
            Custom.calls += 1
            return super().allocate(nbytes, stream, alignment)
    mr2 = StatisticsAdaptor(Custom(HostMemoryResource()))
    assert "allocate" not in vars(mr2)
    mr2.deallocate(mr2.allocate(64, S), 64, S)
    assert Custom.calls == 1 and mr2.statistics.total_bytes == 64


def test_measure_context_and_fields_are_documented():
    mr = StatisticsAdaptor(HostMemoryResource())
    with mr.measure() as m:
        p = mr.allocate(4096, S)
        mr.deallocate(p, 4096, S)
    assert m.result == Statistics(0, 4096, 4096, 0, 1, 1)
    import dataclasses
    import inspect
    src = inspect.getsource(Statistics)
    for f in dataclasses.fields(Statistics):
        assert f'{f.name}: int = 0\n    """' in src, f"{f.name} needs a docstring"


def test_adaptors_forward_properties_and_errors(sim):
    up = PoolResource(CudaMemoryResource())
    mr = StatisticsAdaptor(LimitingAdaptor(up, "1 MiB"))
    assert mr.device_accessible and not mr.host_accessible and mr.device_id == 0
    assert mr.max_alignment == up.max_alignment and mr.driver is sim
    assert mr.pool_size == 0 and callable(mr.release)  # the stack's helpers stay reachable
    with pytest.raises(ValueError):
        mr.deallocate(1234, 8, S)
    assert mr.statistics == Statistics()
    with pytest.raises(TypeError):
        StatisticsAdaptor("not a resource")


def test_limiting_names_limit_current_and_request():
    mr = LimitingAdaptor(HostMemoryResource(), "1 KiB")
    p = mr.allocate(1000, S)
    with pytest.raises(OutOfMemoryError) as e:
        mr.allocate(100, S)
    msg = str(e.value)
    assert "100 bytes" in msg and "1024" in msg and "1000 bytes are in use" in msg
    assert mr.used_bytes == 1000
    mr.deallocate(p, 1000, S)
    assert mr.used_bytes == 0


def test_limit_holds_under_eight_threads():
    limit = 64 * 1024
    mr = LimitingAdaptor(HostMemoryResource(), limit)
    peak = [0]
    lock = threading.Lock()
    live = [0]

    def work():
        for i in range(300):
            try:
                p = mr.allocate(4096, S)
            except OutOfMemoryError:
                continue
            with lock:
                live[0] += 4096
                peak[0] = max(peak[0], live[0])
            assert mr.used_bytes <= limit
            with lock:
                live[0] -= 4096
            mr.deallocate(p, 4096, S)

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert peak[0] <= limit and mr.used_bytes == 0


def test_limiting_rolls_back_when_upstream_fails():
    mr = LimitingAdaptor(LimitingAdaptor(HostMemoryResource(), 100), 1000)
    with pytest.raises(OutOfMemoryError):
        mr.allocate(500, S)
    assert mr.used_bytes == 0


def test_tracking_reports_leaks_with_stacks():
    mr = TrackingAdaptor(HostMemoryResource(), capture_stacks=True)
    p = mr.allocate(300, S)
    q = mr.allocate(100, S)
    assert mr.outstanding() == {p: 300, q: 100}
    report = mr.leak_report()
    assert report.startswith("2 outstanding allocations, 400 bytes") and "test_tracking_reports_leaks" in report
    with pytest.raises(ValueError, match="never handed out"):
        mr.deallocate(p + 1, 300, S)
    with pytest.raises(ValueError, match="does not match"):
        mr.deallocate(p, 301, S)
    mr.deallocate(p, 300, S)
    mr.deallocate(q, 100, S)
    assert mr.leak_report() == "no outstanding allocations"


def test_retry_calls_back_and_retries():
    inner = LimitingAdaptor(HostMemoryResource(), 1000)
    hog = inner.allocate(900, S)
    calls = []

    def cb(nbytes, attempt):
        calls.append((nbytes, attempt))
        if attempt == 2:
            inner.deallocate(hog, 900, S)  # e.g. trimming a cache
        return attempt < 5

    mr = RetryAdaptor(inner, cb)
    p = mr.allocate(500, S)
    assert calls == [(500, 1), (500, 2)]
    mr.deallocate(p, 500, S)
    give_up = RetryAdaptor(LimitingAdaptor(HostMemoryResource(), 10), lambda n, a: a < 3)
    with pytest.raises(OutOfMemoryError):
        give_up.allocate(11, S)


def test_logging_writes_rmm_format_and_replays(sim, tmp_path):
    path = tmp_path / "log.csv"
    mr = LoggingAdaptor(CudaMemoryResource(), path)
    s = Stream.create()
    a = mr.allocate(1000, s)
    b = mr.allocate(2000, S)
    mr.deallocate(a, 1000, s)
    mr.deallocate(b, 2000, S)
    with pytest.raises(OutOfMemoryError):
        mr.allocate(1 << 40, s)
    mr.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "Thread,Time,Action,Pointer,Size,Stream"
    assert [ln.split(",")[2] for ln in lines[1:]] == ["allocate", "allocate", "free", "free", "allocate failure"]
    assert lines[1].split(",")[3] == hex(a) and lines[1].split(",")[5] == hex(s.handle)
    events = read_log(path)
    assert [(e.action, e.size) for e in events] == [("allocate", 1000), ("allocate", 2000), ("free", 1000),
                                                    ("free", 2000), ("allocate failure", 1 << 40)]
    target = StatisticsAdaptor(PoolResource(CudaMemoryResource()))
    report = replay(path, target)
    assert report.events == 4 and report.peak_live_bytes == 3000 and report.failures == 0
    assert report.held_bytes == 2 << 20 and target.statistics.total_bytes == 3000


RMM_LOG = """Thread,Time,Action,Pointer,Size,Stream
140573312345856,1634567890.123456,allocate,0x7f8a40000000,1024,0x0
140573312345856,1634567890.234567,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,1634567890.345678,deallocate,0x7f8a40000000,1024,0x0
140573312345856,17:08:49.624125,allocate,0x7f8a40000000,4096,0x7f8a38001020
140573312345856,1634567890.445678,free,0x7f8a40000400,2048,0x7f8a38001020
"""


def test_replays_an_rmm_log(sim):
    events = read_log(RMM_LOG)
    assert [e.action for e in events] == ["allocate", "allocate", "free", "allocate", "free"]
    report = replay(io.StringIO(RMM_LOG), StatisticsAdaptor(CudaMemoryResource()))
    assert report.events == 5 and report.peak_live_bytes == 2048 + 4096


def test_read_log_names_the_bad_line():
    with pytest.raises(ValueError, match="line 3"):
        read_log("Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x10,8,0x0\n1,1.0,explode,0x10,8,0x0\n")
    with pytest.raises(ValueError, match="line 1"):
        read_log("a,b,c\n")


def test_logging_is_whole_lines_across_threads(sim):
    buf = io.StringIO()
    mr = LoggingAdaptor(HostMemoryResource(), buf, buffer_lines=7)

    def work():
        for _ in range(200):
            mr.deallocate(mr.allocate(64, S), 64, S)

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    mr.flush()
    events = read_log(buf.getvalue())
    assert len(events) == 8 * 200 * 2
