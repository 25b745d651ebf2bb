"""Free lists: size classes with best fit by one bisection, O(1) neighbour coalescing through address maps."""
from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["FreeList", "drain"]


class FreeList:
    """Free blocks of one stream, indexed by size class: ``sizes`` (the distinct free sizes, sorted:
    best fit is one bisection over plain ints), ``bins`` (size -> the blocks of that size, an
    insertion-ordered dict used as a set: any block leaves it in O(1)), ``start`` (ptr -> size) and
    ``end`` (end address -> ptr), for coalescing with both neighbours in O(1). Best fit takes a block
    of the smallest size that holds the request. Blocks never
    merge across an address in ``boundaries`` (the start of an upstream chunk). Among blocks of one
    size the lowest address is taken, so placement does not depend on the order of frees.

    Not thread-safe: only ever touched under its arena's lock."""

    __slots__ = ("sizes", "bins", "start", "end", "size_at", "ending_at")

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.bins: dict[int, dict[int, None]] = {}
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}
        # size_at(ptr): the size of the free block that starts at ptr, or None; ending_at(end): the
        # start of the free block that ends at end, or None (the maps' own lookups: no Python frame)
        self.size_at = self.start.get
        self.ending_at = self.end.get

    def __len__(self) -> int:
        return len(self.start)

    def add(self, ptr: int, size: int) -> None:
        """Add a block without coalescing."""
        b = self.bins.get(size)
        if b is None:
            self.bins[size] = {ptr: None}
            insort(self.sizes, size)
        else:
            b[ptr] = None
        self.start[ptr] = size
        self.end[ptr + size] = ptr

    def remove(self, ptr: int, size: int) -> None:
        """Remove the free block ``[ptr, ptr + size)`` (it must be one)."""
        b = self.bins[size]
        del b[ptr]
        if not b:
            del self.bins[size]
            sizes = self.sizes
            del sizes[bisect_left(sizes, size)]
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

    def insert_drained(self, ptrs: list, size: int, boundaries) -> None:
        """Pop every block of ``size`` out of ``ptrs`` (a cache list; atomic pops, see :func:`drain`)
        and insert each (coalescing)."""
        for p in drain(ptrs):
            self.insert(p, size, boundaries)

    def insert(self, ptr: int, size: int, boundaries) -> None:
        """Add a block, coalescing it with free neighbours on both sides (never across a boundary)."""
        start, end = self.start, self.end
        nxt = ptr + size
        nsize = start.get(nxt)
        if nsize is not None and nxt not in boundaries:  # the next block joins
            self.remove(nxt, nsize)
            size += nsize
        prev = end.get(ptr)
        if prev is not None and ptr not in boundaries:  # the previous block joins
            psize = start[prev]
            self.remove(prev, psize)
            ptr, size = prev, size + psize
        self.add(ptr, size)

    def take(self, size: int, spare: int | None = None) -> int | None:
        """Best fit: cut ``size`` bytes from a block of the smallest size that holds them (the
        remainder stays free); the block at ``spare`` only when nothing else fits. None when nothing
        fits."""
        sizes = self.sizes
        i = bisect_left(sizes, size)
        if i == len(sizes):
            return None
        bsize = sizes[i]
        b = self.bins[bsize]
        ptr = _pop_lowest(b)
        if ptr == spare:
            if b:  # another block of the same size
                other = _pop_lowest(b)
                b[ptr] = None
                ptr = other
            elif i + 1 < len(sizes):  # the next size up
                b[ptr] = None
                i += 1
                bsize = sizes[i]
                b = self.bins[bsize]
                ptr = _pop_lowest(b)
        if not b:
            del self.bins[bsize]
            del sizes[i]
        del self.start[ptr]
        del self.end[ptr + bsize]
        if bsize > size:  # the remainder: its neighbours are not free (the block was maximal)
            self.add(ptr + size, bsize - size)
        return ptr

    def fits(self, size: int) -> int | None:
        """The smallest free size that holds ``size``, or None."""
        sizes = self.sizes
        i = bisect_left(sizes, size)
        return sizes[i] if i < len(sizes) else None

    def candidates(self, size: int, n: int):
        """Up to ``n`` blocks ``(size, ptr)`` that hold ``size``, best fit first (the first is the one
        :meth:`take` would cut from, ignoring ``spare``)."""
        sizes, bins = self.sizes, self.bins
        out = []
        for s in sizes[bisect_left(sizes, size):]:
            for p in sorted(bins[s]):
                out.append((s, p))
                if len(out) == n:
                    return out
        return out

    def blocks(self) -> list[tuple[int, int]]:
        """Every free block as ``(size, ptr)``, smallest first, lowest address first within a size (a
        list: safe to change the free list while walking it)."""
        bins = self.bins
        return [(s, p) for s in self.sizes for p in sorted(bins[s])]

    def items(self) -> list[tuple[int, int]]:
        """Every free block as ``(ptr, size)``, lowest address first (a list)."""
        return sorted(self.start.items())

    def absorb(self, other: "FreeList", boundaries) -> "FreeList":
        """Merge ``other`` into whichever of the two is larger and return that one (the smaller list
        is inserted into the larger, so a hand-over to a stream with nothing free is O(1))."""
        big, small = (self, other) if len(self.start) >= len(other.start) else (other, self)
        for size, ptr in small.blocks():
            big.insert(ptr, size, boundaries)
        return big

    def largest(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def total(self) -> int:
        bins = self.bins
        return sum(s * len(bins[s]) for s in self.sizes)


def _pop_lowest(b: dict) -> int:
    """Take the lowest address out of a size class (a workload that runs again lands where it did)."""
    if len(b) == 1:
        return b.popitem()[0]
    ptr = min(b)
    del b[ptr]
    return ptr


def drain(lst: list):
    """Pop every element of ``lst`` with atomic pops: with lock-free appenders and poppers around,
    each element is taken by exactly one party."""
    pop = lst.pop
    while lst:
        try:
            yield pop()
        except IndexError:
            return
