"""A log dropped without ``close()`` keeps what it recorded, as a Python file writes what it buffered:
its events are written and the file it opened is closed, in a garbage cycle too."""
from __future__ import annotations

import gc
import io
import weakref

from mrkit import DEFAULT_STREAM, CudaMemoryResource, LoggingAdaptor, read_log


def _drop(make):
    """Build with ``make()``, return a weak reference after the last strong one is gone."""
    obj = make()
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is None, "the resource is still referenced somewhere"
    return ref


def _two_events(lg):
    p = lg.allocate(100, DEFAULT_STREAM)
    lg.deallocate(p, 100, DEFAULT_STREAM)
    return lg


def test_a_dropped_log_writes_its_buffered_events_to_its_file(sim, tmp_path):
    path = tmp_path / "mem.csv"
    _drop(lambda: _two_events(LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000,
                                             flush_interval=None)))
    events = read_log(path)
    assert [e.action for e in events] == ["allocate", "free"]


def test_a_dropped_log_in_a_reference_cycle_keeps_its_events(sim, tmp_path):
    path = tmp_path / "mem.csv"

    def make():
        lg = _two_events(LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000, flush_interval=None))
        holder = {"log": lg}
        holder["self"] = holder  # garbage only the collector finds: its file may be finalized first
        return lg

    lg = make()
    ref = weakref.ref(lg)
    del lg
    gc.collect()
    assert ref() is None
    assert [e.action for e in read_log(path)] == ["allocate", "free"]


def test_a_log_the_timer_has_flushed_is_collected_when_dropped(sim, tmp_path):
    import time

    path = tmp_path / "mem.csv"
    lg = _two_events(LoggingAdaptor(CudaMemoryResource(0), path, buffer_lines=1000, flush_interval=0.01))
    deadline = time.monotonic() + 10
    while lg._buf and time.monotonic() < deadline:  # the flusher thread writes the two events
        time.sleep(0.01)
    time.sleep(0.05)  # and goes back to sleep, having looked at this log
    ref = weakref.ref(lg)
    del lg
    gc.collect()
    assert ref() is None, "the flusher thread kept the log alive"
    assert [e.action for e in read_log(path)] == ["allocate", "free"]


def test_a_dropped_log_flushes_into_a_sink_it_does_not_own_and_leaves_it_open(sim):
    sink = io.StringIO()
    _drop(lambda: _two_events(LoggingAdaptor(CudaMemoryResource(0), sink, buffer_lines=1000, flush_interval=None)))
    assert not sink.closed
    assert [e.action for e in read_log(io.StringIO(sink.getvalue()))] == ["allocate", "free"]
