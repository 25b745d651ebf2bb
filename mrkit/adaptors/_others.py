"""Limiting, tracking and retry adaptors."""
from __future__ import annotations

import threading
import traceback
from typing import Callable

from .._errors import OutOfMemoryError
from .._resource import MemoryResource, check_pointer, check_request, check_size, size_mismatch
from .._sizes import format_size, parse_size
from ._base import Adaptor

__all__ = ["LimitingAdaptor", "TrackingAdaptor", "RetryAdaptor"]


class LimitingAdaptor(Adaptor):
    """Caps the bytes outstanding through it at ``limit`` (an int or ``"8 GiB"``). A request that
    would exceed it raises :class:`~mrkit.OutOfMemoryError` naming the limit, the current bytes and
    the request, without calling the upstream. The limit holds under concurrent threads: bytes are
    reserved under a lock before the upstream is asked, and given back if it fails."""

    __slots__ = ("limit", "_lock", "_used")

    def __init__(self, upstream: MemoryResource, limit: int | str) -> None:
        super().__init__(upstream)
        self.limit = parse_size(limit, "limit")
        if self.limit <= 0:
            raise ValueError(f"limit must be positive, got {limit!r}")
        self._lock = threading.Lock()
        self._used = 0

    @property
    def used_bytes(self) -> int:
        return self._used

    def allocate(self, nbytes, stream, alignment=256):
        if type(nbytes) is not int:  # numpy integers count like ints; bad types raise here
            nbytes = check_request(nbytes, alignment, 1 << 62)
        if nbytes <= 0:
            return self._up_alloc(nbytes, stream, alignment)  # zero, or the upstream's precise error
        with self._lock:
            used = self._used
            if used + nbytes > self.limit:
                raise OutOfMemoryError(
                    f"{self!r}: a request of {nbytes} bytes ({format_size(nbytes)}) would exceed the "
                    f"limit of {self.limit} bytes ({format_size(self.limit)}); {used} bytes are in use",
                    nbytes, self)
            self._used = used + nbytes
        try:
            return self._up_alloc(nbytes, stream, alignment)
        except BaseException:
            with self._lock:
                self._used -= nbytes
            raise

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if type(nbytes) is not int:
            nbytes = check_request(nbytes, alignment, 1 << 62)
        self._up_free(ptr, nbytes, stream, alignment)
        if ptr:
            with self._lock:
                self._used -= nbytes

    def _describe(self) -> str:
        return f"{self.upstream!r}, limit={self.limit}"


class TrackingAdaptor(Adaptor):
    """Remembers every outstanding allocation (with the stack that made it when
    ``capture_stacks=True``): :meth:`outstanding`, :meth:`leak_report`. A free of a pointer it never
    handed out (or with the wrong size) raises ``ValueError`` before reaching the upstream."""

    __slots__ = ("capture_stacks", "_lock", "_live")

    def __init__(self, upstream: MemoryResource, capture_stacks: bool = False) -> None:
        super().__init__(upstream)
        self.capture_stacks = bool(capture_stacks)
        self._lock = threading.Lock()
        self._live: dict[int, tuple[int, object, str | None]] = {}

    def allocate(self, nbytes, stream, alignment=256):
        if type(nbytes) is not int:  # the table holds ints (a NumPy size is converted, a float refused)
            nbytes = check_size(nbytes, "nbytes")
        ptr = self._up_alloc(nbytes, stream, alignment)
        if ptr:
            stack = "".join(traceback.format_stack(limit=16)[:-1]) if self.capture_stacks else None
            with self._lock:
                self._live[ptr] = (nbytes, stream, stack)
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if type(ptr) is not int:  # a float equal to a live pointer would find it in the table
            ptr = check_pointer(ptr)
        if ptr == 0 and nbytes == 0:
            return self._up_free(ptr, nbytes, stream, alignment)
        with self._lock:
            entry = self._live.get(ptr)
            if entry is None:
                raise ValueError(f"ptr {ptr:#x} was never handed out by {self!r} (or was "
                                 f"already freed)")
            if entry[0] != nbytes:
                raise size_mismatch(nbytes, entry[0], ptr)
            del self._live[ptr]
        try:
            self._up_free(ptr, nbytes, stream, alignment)
        except BaseException:
            with self._lock:
                self._live[ptr] = entry
            raise

    @property
    def live_bytes(self) -> int:
        with self._lock:
            return sum(e[0] for e in self._live.values())

    def outstanding(self) -> dict[int, int]:
        """``{ptr: nbytes}`` of allocations not yet freed."""
        with self._lock:
            return {p: e[0] for p, e in self._live.items()}

    def records(self) -> dict[int, tuple[int, str | None]]:
        """``{ptr: (nbytes, stack text or None)}`` of allocations not yet freed."""
        with self._lock:
            return {p: (e[0], e[2]) for p, e in self._live.items()}

    def leak_report(self) -> str:
        """A readable report of outstanding allocations, largest first, with stacks if captured."""
        with self._lock:
            items = sorted(self._live.items(), key=lambda kv: -kv[1][0])
        if not items:
            return "no outstanding allocations"
        total = sum(e[0] for _, e in items)
        lines = [f"{len(items)} outstanding allocations, {total} bytes ({format_size(total)}):"]
        for ptr, (n, stream, stack) in items:
            lines.append(f"  {ptr:#x}: {n} bytes on {stream!r}")
            if stack:
                lines.extend("    " + ln for ln in stack.rstrip().splitlines())
        return "\n".join(lines)


class RetryAdaptor(Adaptor):
    """On :class:`~mrkit.OutOfMemoryError` from the upstream, calls ``callback(nbytes, attempt)``
    (attempt counts from 1) and retries while it returns True; the last error propagates once it
    returns False or after ``max_attempts`` retries. A typical callback trims pools or runs
    ``gc.collect()`` to drop unreachable buffers."""

    __slots__ = ("callback", "max_attempts")

    def __init__(self, upstream: MemoryResource, callback: Callable[[int, int], bool], max_attempts: int = 8) -> None:
        super().__init__(upstream)
        if not callable(callback):
            raise TypeError("callback must be callable")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.callback = callback
        self.max_attempts = max_attempts

    def allocate(self, nbytes, stream, alignment=256):
        try:
            return self._up_alloc(nbytes, stream, alignment)
        except OutOfMemoryError as exc:
            last = exc
        for attempt in range(1, self.max_attempts + 1):
            if not self.callback(nbytes, attempt):
                break
            try:
                return self._up_alloc(nbytes, stream, alignment)
            except OutOfMemoryError as exc:
                last = exc
        raise last
