"""``StatisticsAdaptor``: byte and allocation counters with a push/pop stack."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

from .._resource import MemoryResource
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
    bytes are not counted. Thread-safe: one lock guards the counters.
    """

    __slots__ = ("_lock", "_stack")

    def __init__(self, upstream: MemoryResource) -> None:
        super().__init__(upstream)
        self._lock = threading.Lock()
        self._stack = [[0, 0, 0, 0, 0, 0]]  # cur_b, peak_b, tot_b, cur_n, peak_n, tot_n

    def allocate(self, nbytes, stream, alignment=256):
        ptr = self._up_alloc(nbytes, stream, alignment)
        if ptr:
            with self._lock:
                c = self._stack[-1]
                b = c[0] + nbytes
                n = c[3] + 1
                c[0] = b
                c[2] += nbytes
                c[3] = n
                c[5] += 1
                if b > c[1]:
                    c[1] = b
                if n > c[4]:
                    c[4] = n
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        self._up_free(ptr, nbytes, stream, alignment)
        if ptr:
            with self._lock:
                c = self._stack[-1]
                c[0] -= nbytes
                c[3] -= 1

    # -- reading and the stack ----------------------------------------------------------
    @property
    def statistics(self) -> Statistics:
        """The counters of the current (top) frame."""
        with self._lock:
            return Statistics(*self._stack[-1])

    @property
    def live_bytes(self) -> int:
        with self._lock:
            return sum(c[0] for c in self._stack)

    def push_counters(self) -> Statistics:
        """Start a new frame; returns the counters of the frame below as they were."""
        with self._lock:
            below = Statistics(*self._stack[-1])
            self._stack.append([0, 0, 0, 0, 0, 0])
            return below

    def pop_counters(self) -> Statistics:
        """End the top frame, fold it into the one below and return it."""
        with self._lock:
            if len(self._stack) == 1:
                raise ValueError("pop_counters: no frame was pushed")
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
