"""``StatisticsAdaptor``: byte and allocation counters with a push/pop stack."""
from __future__ import annotations

import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .._resource import MemoryResource, check_request
from .._engine import hot_paths
from ._base import Adaptor

__all__ = ["StatisticsAdaptor", "Statistics"]


@dataclass(frozen=True)
class Statistics:
    """A snapshot of one counter frame. After a :meth:`~StatisticsAdaptor.pop_counters`, memory
    allocated inside a popped frame and freed outside it makes ``current_*`` of the outer frame
    negative: that is the exact arithmetic, not an error."""

    current_bytes: int = 0
    """Bytes allocated and not yet freed in this frame."""
    peak_bytes: int = 0
    """Highest ``current_bytes`` reached in this frame (since its push or last peak reset)."""
    total_bytes: int = 0
    """Bytes allocated in this frame, frees not subtracted."""
    current_count: int = 0
    """Allocations made and not yet freed in this frame."""
    peak_count: int = 0
    """Highest ``current_count`` reached in this frame."""
    total_count: int = 0
    """Allocations made in this frame, frees not subtracted."""


def _fold_loop(batch, b, peak_b, tot_b, k, peak_k, tot_k):
    """Apply signed byte events in order (``+n`` allocated, ``-n`` freed) to one frame's counters."""
    for d in batch:
        b += d
        if d > 0:
            tot_b += d
            k += 1
            tot_k += 1
            if b > peak_b:
                peak_b = b
            if k > peak_k:
                peak_k = k
        else:
            k -= 1
    return b, peak_b, tot_b, k, peak_k, tot_k


def _fold_array(batch, b, peak_b, tot_b, k, peak_k, tot_k):
    """:func:`_fold_loop` with numpy (exact: int64 running sums; the same result, fewer Python steps).
    ``struct`` converts the Python ints about twice as fast as ``numpy.fromiter``."""
    n = len(batch)
    a = np.frombuffer(struct.pack(f"{n}q", *batch), dtype=np.int64)
    run = a.cumsum()
    steps = np.sign(a).cumsum()  # +1 per allocation, -1 per free
    s, ds = int(run[-1]), int(steps[-1])
    # allocated bytes = (sum + sum of magnitudes) / 2; allocations = (events + net count) / 2
    return (b + s, max(peak_b, b + int(run.max())), tot_b + (s + int(np.abs(a).sum())) // 2,
            k + ds, max(peak_k, k + int(steps.max())), tot_k + (n + ds) // 2)


_FOLD_AT = 4096  # pending events that make a free fold the counters (bounds the event list)


class _Measurement:
    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: Statistics | None = None


class StatisticsAdaptor(Adaptor):
    """Counts current, peak and total bytes and allocations of everything that passes through.

    Counters live in a stack of frames: :meth:`push_counters` starts a fresh frame,
    :meth:`pop_counters` ends it, returns its :class:`Statistics` and folds it into the frame below
    (current and total add; the lower peak becomes ``max(peak, current_before + popped_peak)``).
    ``with mr.measure() as m:`` measures a region (``m.result`` after the block). Allocations of zero
    bytes are not counted, nor is a free of memory that was not allocated through the adaptor (it is
    passed to the upstream, so the memory goes home, and the counters never go negative).

    Threads: each allocation or free is recorded by one atomic append to an event list (``+n`` or
    ``-n``); the counters are brought up to date from that list, in append order, under a lock —
    whenever they are read, a frame is pushed or popped, or a free finds more than ``_FOLD_AT`` events
    pending (large batches are folded with numpy). The append order is the order the statistics
    describe, so peaks and totals are exact.

    Over a :class:`~mrkit.PoolResource` (or a subclass that keeps its hot path) the adaptor's
    ``allocate``/``deallocate`` are the pool's own hot path with the append fused in, so counting adds
    no Python call of its own; only calls made through the adaptor are counted, as always.
    """

    __slots__ = ("_lock", "_stack", "_events", "_counted", "__dict__")

    def __init__(self, upstream: MemoryResource) -> None:
        super().__init__(upstream)
        self._lock = threading.Lock()
        self._stack = [[0, 0, 0, 0, 0, 0]]  # cur_b, peak_b, tot_b, cur_n, peak_n, tot_n
        self._events: list[int] = []  # signed byte events (a list appends fastest)
        self._counted: dict[int, int] = {}  # ptr -> nbytes of live blocks it counted
        if type(self) is StatisticsAdaptor:  # subclasses keep their own methods
            fused = hot_paths(upstream, "counting", events=self._events, on_full=self._fold, limit=_FOLD_AT,
                              counted=self._counted)
            if fused is not None:
                self.allocate, self.deallocate = fused  # instance attributes win over the methods

    def allocate(self, nbytes, stream, alignment=256):
        if type(nbytes) is not int:  # numpy sizes (np.uint64 would negate wrongly) become ints
            nbytes = check_request(nbytes, alignment, 1 << 62)
        ptr = self._up_alloc(nbytes, stream, alignment)
        if ptr:
            self._counted[ptr] = nbytes
            self._events.append(nbytes)  # the pending-events check is on frees (bounded by live blocks)
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if type(nbytes) is not int:
            nbytes = check_request(nbytes, alignment, 1 << 62)
        # forgotten before the upstream frees (another thread may be handed ptr at once after)
        c = self._counted.pop(ptr, None)
        try:
            self._up_free(ptr, nbytes, stream, alignment)
        except BaseException:
            if c is not None:
                self._counted[ptr] = c
            raise
        if c is not None:  # memory it never counted (allocated around it) goes home uncounted
            events = self._events
            events.append(-nbytes)
            if len(events) > _FOLD_AT:
                self._fold()

    def _fold(self) -> None:
        with self._lock:
            self._fold_locked()

    def _fold_locked(self) -> None:
        events = self._events
        n = len(events)
        if not n:
            return
        batch = events[:n]
        del events[:n]  # appends made meanwhile stay for the next fold
        c = self._stack[-1]
        if n < 64:
            c[:] = _fold_loop(batch, *c)
        else:
            c[:] = _fold_array(batch, *c)

    # -- reading and the stack ----------------------------------------------------------
    @property
    def statistics(self) -> Statistics:
        """The counters of the current (top) frame."""
        with self._lock:
            self._fold_locked()
            return Statistics(*self._stack[-1])

    @property
    def live_bytes(self) -> int:
        with self._lock:
            self._fold_locked()
            return sum(c[0] for c in self._stack)

    def push_counters(self) -> Statistics:
        """Start a new frame; returns the counters of the frame below as they were."""
        with self._lock:
            self._fold_locked()
            below = Statistics(*self._stack[-1])
            self._stack.append([0, 0, 0, 0, 0, 0])
            return below

    def pop_counters(self) -> Statistics:
        """End the top frame, fold it into the one below and return it."""
        with self._lock:
            if len(self._stack) == 1:
                raise ValueError("pop_counters: no frame was pushed")
            self._fold_locked()
            top = self._stack.pop()
            low = self._stack[-1]
            low[1] = max(low[1], low[0] + top[1])
            low[4] = max(low[4], low[3] + top[4])
            low[0] += top[0]
            low[2] += top[2]
            low[3] += top[3]
            low[5] += top[5]
            return Statistics(*top)

    def reset_peak(self) -> None:
        """Set the top frame's peaks to its current values."""
        with self._lock:
            self._fold_locked()
            c = self._stack[-1]
            c[1], c[4] = c[0], c[3]

    @contextmanager
    def measure(self):
        """``with mr.measure() as m: ...`` then ``m.result`` is the region's :class:`Statistics`."""
        m = _Measurement()
        self.push_counters()
        try:
            yield m
        finally:
            m.result = self.pop_counters()
