"""Free lists: best fit on a size-sorted list, O(1) neighbour coalescing through address maps."""
from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["FreeList", "drain"]


class FreeList:
    """Free blocks of one stream: ``sizes`` (sorted ``(size, ptr)`` pairs, for best fit), ``start``
    (ptr -> size) and ``end`` (end address -> ptr), for coalescing with both neighbours in O(1).
    Blocks never merge across an address in ``boundaries`` (the start of an upstream chunk).

    Not thread-safe: only ever touched under its arena's lock."""

    __slots__ = ("sizes", "start", "end")

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int]] = []
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}

    def add(self, ptr: int, size: int) -> None:
        """Add a block without coalescing."""
        insort(self.sizes, (size, ptr))
        self.start[ptr] = size
        self.end[ptr + size] = ptr

    def remove(self, ptr: int, size: int) -> None:
        """Remove the free block ``[ptr, ptr + size)`` (it must be one)."""
        del self.sizes[bisect_left(self.sizes, (size, ptr))]
        del self.start[ptr]
        del self.end[ptr + size]

    def cut(self, block: int, at: int, size: int) -> int:
        """Take ``[at, at + size)`` out of the free block that starts at ``block``; what lies before
        and after it stays free. Returns the start of the piece after it (``at + size``)."""
        end = block + self.start[block]
        self.remove(block, end - block)
        if at > block:
            self.add(block, at - block)
        if end > at + size:
            self.add(at + size, end - at - size)
        return at + size

    def insert(self, ptr: int, size: int, boundaries) -> None:
        """Add a block, coalescing it with free neighbours on both sides (never across a boundary)."""
        sizes, start, end = self.sizes, self.start, self.end
        nxt = ptr + size
        nsize = start.get(nxt)
        if nsize is not None and nxt not in boundaries:
            del sizes[bisect_left(sizes, (nsize, nxt))]
            del start[nxt]
            del end[nxt + nsize]
            size += nsize
        prev = end.get(ptr)
        if prev is not None and ptr not in boundaries:
            psize = start.pop(prev)
            del sizes[bisect_left(sizes, (psize, prev))]
            del end[ptr]
            ptr, size = prev, size + psize
        insort(sizes, (size, ptr))
        start[ptr] = size
        end[ptr + size] = ptr

    def take(self, size: int, spare: int | None = None) -> int | None:
        """Best fit: cut ``size`` bytes from the smallest block that holds them (the remainder stays
        free); the block at ``spare`` only when nothing else fits. None when nothing fits."""
        sizes = self.sizes
        i = bisect_left(sizes, (size, 0))
        if i == len(sizes):
            return None
        bsize, ptr = sizes[i]
        if ptr == spare and i + 1 < len(sizes):
            i += 1
            bsize, ptr = sizes[i]
        del sizes[i]
        start, end = self.start, self.end
        del start[ptr]
        if bsize > size:
            rest, rsize = ptr + size, bsize - size
            insort(sizes, (rsize, rest))
            start[rest] = rsize
            end[ptr + bsize] = rest
        else:
            del end[ptr + bsize]
        return ptr

    def absorb(self, other: "FreeList", boundaries) -> "FreeList":
        """Merge ``other`` into whichever of the two is larger and return that one (the smaller list
        is inserted into the larger, so a hand-over to a stream with nothing free is O(1))."""
        big, small = (self, other) if len(self.sizes) >= len(other.sizes) else (other, self)
        for size, ptr in small.sizes:
            big.insert(ptr, size, boundaries)
        return big

    def largest(self) -> int:
        return self.sizes[-1][0] if self.sizes else 0

    def total(self) -> int:
        return sum(s for s, _ in self.sizes)


def drain(lst: list):
    """Pop every element of ``lst`` with atomic pops: with lock-free appenders and poppers around,
    each element is taken by exactly one party."""
    pop = lst.pop
    while lst:
        try:
            yield pop()
        except IndexError:
            return
