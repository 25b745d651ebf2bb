"""Memory statistics of the current resource, per scope and per code location (in the spirit of
``rmm.statistics``).

::

    import mrkit.statistics as ms

    ms.enable_statistics()                  # the current resource, wrapped in a StatisticsAdaptor
    with ms.statistics() as s:              # counters of this scope only (nested scopes: their own)
        work()
    print(s.peak_bytes, s.total_count)

    @ms.profiler(name="step")               # or: with ms.profiler("load"): ...
    def step(): ...
    print(ms.report())                      # one row per name: calls, allocations, bytes, peak

A scope counts every allocation made through the resource while it is open, from any thread (the
counters live in the resource's adaptor, as in RMM). A scope or profiler that found no
:class:`~mrkit.StatisticsAdaptor` installs one for its duration and puts the previous resource back
when it closes, as RMM does; :func:`enable_statistics` installs one for good. Records are kept per
process, under a lock. RMM's ``push_statistics``/``pop_statistics``/``default_profiler_records`` are
here under the same names.
"""
from __future__ import annotations

import functools
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from ._current import get_current_resource, set_current_resource
from ._sizes import format_size
from .adaptors import StatisticsAdaptor
from .adaptors._statistics import Statistics

__all__ = ["enable_statistics", "get_statistics", "statistics", "profiler", "report", "profiler_records",
           "reset_profiler", "ProfilerRecord", "Scope", "push_statistics", "pop_statistics",
           "default_profiler_records"]


def enable_statistics(device: int | None = None) -> StatisticsAdaptor:
    """Make the current resource of ``device`` (default: the current device) count: wrap it in a
    :class:`~mrkit.StatisticsAdaptor` unless it already is one. Returns the adaptor."""
    mr = get_current_resource(device)
    if isinstance(mr, StatisticsAdaptor):
        return mr
    stats = StatisticsAdaptor(mr)
    set_current_resource(stats, device if device is not None else mr.device_id)
    return stats


def get_statistics(device: int | None = None) -> Statistics | None:
    """The counters of the innermost open scope of ``device``'s current resource (None when that
    resource does not count)."""
    mr = get_current_resource(device)
    return mr.statistics if isinstance(mr, StatisticsAdaptor) else None


class Scope:
    """What :func:`statistics` yields: the scope's counters, live while it is open and frozen after."""

    def __init__(self, adaptor: StatisticsAdaptor) -> None:
        self._adaptor = adaptor
        self._final: Statistics | None = None

    @property
    def counters(self) -> Statistics:
        return self._final if self._final is not None else self._adaptor.statistics

    def __getattr__(self, name):  # current_bytes, peak_bytes, total_bytes, current_count, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.counters, name)

    def __repr__(self) -> str:
        c = self.counters
        return (f"<mrkit statistics scope: peak {format_size(c.peak_bytes)}, current {format_size(c.current_bytes)}, "
                f"{c.total_count} allocations ({format_size(c.total_bytes)})>")


@contextmanager
def statistics(device: int | None = None):
    """``with statistics() as s:`` — the counters of this scope. If the current resource does not
    count, it is wrapped in a :class:`~mrkit.StatisticsAdaptor` for the scope and put back when the
    scope closes (unless something else was made current meanwhile). Allocations live when the scope
    opens do not count; nested scopes each see their own peak, and an outer scope's peak includes
    its inner scopes'."""
    base = get_current_resource(device)
    dev = device if device is not None else base.device_id
    installed = None
    if isinstance(base, StatisticsAdaptor):
        mr = base
    else:
        mr = installed = StatisticsAdaptor(base)
        set_current_resource(installed, dev)
    mr.push_counters()
    scope = Scope(mr)
    try:
        yield scope
    finally:
        scope._final = mr.pop_counters()
        if installed is not None and get_current_resource(dev) is installed:
            set_current_resource(base, dev)


def push_statistics(device: int | None = None) -> Statistics | None:
    """RMM's ``push_statistics``: start a new counter frame on the current resource's adaptor; returns
    the counters below as they were (``None`` when the current resource does not count)."""
    mr = get_current_resource(device)
    return mr.push_counters() if isinstance(mr, StatisticsAdaptor) else None


def pop_statistics(device: int | None = None) -> Statistics | None:
    """RMM's ``pop_statistics``: end the top counter frame and return it (``None`` when the current
    resource does not count)."""
    mr = get_current_resource(device)
    return mr.pop_counters() if isinstance(mr, StatisticsAdaptor) else None


@dataclass
class ProfilerRecord:
    """What :func:`profiler` saw under one name."""

    name: str
    calls: int = 0
    allocations: int = 0
    total_bytes: int = 0
    peak_bytes: int = 0
    """The highest peak of one call (bytes allocated within it and live at once)."""

    def add(self, s: Statistics) -> None:
        self.calls += 1
        self.allocations += s.total_count
        self.total_bytes += s.total_bytes
        self.peak_bytes = max(self.peak_bytes, s.peak_bytes)


_records: dict[str, ProfilerRecord] = {}
_records_lock = threading.Lock()


def _caller_name(depth: int) -> str:
    f = sys._getframe(depth)
    return f"{f.f_code.co_filename}:{f.f_lineno}"


class profiler:
    """Record the memory of a code region under ``name``: as a decorator (default name: the
    function's qualified name and its file and line) or a context manager (default: the caller's file
    and line). :func:`report` prints every record."""

    def __init__(self, name: str | None = None, device: int | None = None) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        self.name = name
        self.device = device
        self._open: list = []

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError(f"profiler decorates a function, not {type(fn).__name__}")
        name = self.name or f"{fn.__qualname__} ({fn.__code__.co_filename}:{fn.__code__.co_firstlineno})"
        device = self.device

        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            scope = None
            try:
                with statistics(device) as scope:
                    return fn(*args, **kwargs)
            finally:
                if scope is not None:
                    _record(name, scope.counters)
        return recorded

    def __enter__(self):
        name = self.name or _caller_name(2)
        cm = statistics(self.device)
        scope = cm.__enter__()
        self._open.append((name, cm, scope))
        return scope

    def __exit__(self, *exc):
        name, cm, scope = self._open.pop()
        cm.__exit__(*exc)
        _record(name, scope.counters)
        return False


def _record(name: str, s: Statistics) -> None:
    with _records_lock:
        rec = _records.get(name)
        if rec is None:
            rec = _records[name] = ProfilerRecord(name)
        rec.add(s)


def profiler_records() -> dict[str, ProfilerRecord]:
    """A copy of every record, by name."""
    with _records_lock:
        return {k: ProfilerRecord(**vars(v)) for k, v in _records.items()}


def reset_profiler() -> None:
    with _records_lock:
        _records.clear()


def report(sort_by: str = "total_bytes") -> str:
    """The records as a table, largest first by ``sort_by`` (``total_bytes``, ``peak_bytes``,
    ``allocations`` or ``calls``)."""
    if sort_by not in ("total_bytes", "peak_bytes", "allocations", "calls"):
        raise ValueError(f"sort_by must be total_bytes, peak_bytes, allocations or calls, got {sort_by!r}")
    recs = sorted(profiler_records().values(), key=lambda r: getattr(r, sort_by), reverse=True)
    rows = [("name", "calls", "allocations", "total", "peak")]
    rows += [(r.name, str(r.calls), str(r.allocations), format_size(r.total_bytes), format_size(r.peak_bytes))
             for r in recs]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class _ProfilerRecords:
    """RMM's ``default_profiler_records``: ``.records`` (name -> :class:`ProfilerRecord`) and
    ``.report()``, over this module's records."""

    @property
    def records(self) -> dict[str, ProfilerRecord]:
        return profiler_records()

    def report(self, ordered_by: str = "total_bytes") -> str:
        return report(ordered_by)

    def __repr__(self) -> str:
        return report()


default_profiler_records = _ProfilerRecords()
