"""Shared bookkeeping of the driver-backed resources: which pointers they handed out."""
from __future__ import annotations

from .._engine import GRAIN
from .._resource import check_request, size_mismatch, unknown_pointer

__all__ = ["LiveTable"]


class LiveTable:
    """ptr -> nbytes of live allocations, so foreign pointers, double frees and wrong sizes raise
    ``ValueError`` before any driver call (leaving the resource unchanged)."""

    __slots__ = ("live", "owner")

    def __init__(self, owner) -> None:
        self.live: dict[int, int] = {}
        self.owner = owner

    def pop(self, ptr: int, nbytes) -> int:
        """Forget ``ptr`` and return its size; ``TypeError``/``ValueError`` naming the argument
        (nothing changed) when ``nbytes`` is not an int-like or not the size allocated."""
        if type(nbytes) is not int:
            nbytes = check_request(nbytes, GRAIN, GRAIN)
        size = self.live.get(ptr)
        if size is None:
            raise unknown_pointer(ptr, self.owner)
        if size != nbytes:
            raise size_mismatch(nbytes, size, ptr)
        del self.live[ptr]
        return size

    def restore(self, ptr: int, nbytes: int) -> None:
        self.live[ptr] = nbytes

