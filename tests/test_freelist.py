"""FreeList (the engine's size-class index): best fit, coalescing, boundaries, against a model. Each
test runs on both builds: the Python one and its compiled twin (``_hotc.FreeList``) where it is built."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mrkit._engine import _freelist

try:
    from mrkit._engine import _hotc
except ImportError:
    _hotc = None

BUILDS = [pytest.param(_freelist.FreeList, id="python"),
          pytest.param(getattr(_hotc, "FreeList", None), id="compiled",
                       marks=pytest.mark.skipif(_hotc is None, reason="the compiled core is not built here"))]

BASE, G = 1 << 40, 256


def _check(fl, boundaries) -> list[tuple[int, int]]:
    """The index agrees with itself (by size and by address); blocks are disjoint and maximal
    (coalesced unless a boundary separates them). Returns the blocks sorted by address."""
    blocks = fl.items()
    assert blocks == sorted(blocks) and len(blocks) == len(fl)
    assert fl.blocks() == sorted((s, p) for p, s in blocks)  # by size, lowest address first
    assert fl.largest() == max((s for _, s in blocks), default=0)
    assert fl.total() == sum(s for _, s in blocks) and bool(fl) == bool(blocks)
    for p, s in blocks:
        assert fl.size_at(p) == s and fl.ending_at(p + s) == p
        if s > G:  # nothing starts or ends inside a block
            assert fl.size_at(p + G) is None and fl.ending_at(p + s - G) is None
        assert not any(p < b < p + s for b in boundaries), "a block spans a chunk boundary"
    for (p, s), (q, _) in zip(blocks, blocks[1:]):
        assert p + s <= q, "overlapping free blocks"
        assert p + s < q or q in boundaries, "adjacent free blocks were not coalesced"
    return blocks


def _sizes(fl) -> list[int]:
    return sorted({s for s, _ in fl.blocks()})


@pytest.mark.parametrize("FreeList", BUILDS)
def test_best_fit_takes_the_smallest_class_and_the_lowest_block_of_it(FreeList):
    fl = FreeList()
    for i, size in ((2, 4 * G), (0, 8 * G), (1, 4 * G), (3, 16 * G)):
        fl.add(BASE + i * 64 * G, size)
    assert fl.take(3 * G) == BASE + 64 * G  # a 4-grain block, the lower one (not the one added last)
    assert fl.size_at(BASE + 64 * G + 3 * G) == G  # the remainder stays free
    assert fl.take(4 * G) == BASE + 2 * 64 * G
    assert fl.take(9 * G) == BASE + 3 * 64 * G and fl.take(64 * G) is None
    assert fl.take(7 * G) == BASE + 3 * 64 * G + 9 * G  # 7 grains left of the 16: an exact fit
    assert _sizes(fl) == [G, 8 * G]


@pytest.mark.parametrize("FreeList", BUILDS)
def test_the_spare_block_is_taken_only_when_nothing_else_fits(FreeList):
    fl = FreeList()
    fl.add(BASE, 8 * G)  # the spare (the VMM's top)
    fl.add(BASE + 64 * G, 16 * G)
    assert fl.take(4 * G, spare=BASE) == BASE + 64 * G  # the next size up, though 8 fits better
    assert fl.take(8 * G, spare=BASE) == BASE + 68 * G
    assert fl.take(8 * G, spare=BASE) == BASE  # nothing else fits now
    _check(fl, set())


@pytest.mark.parametrize("FreeList", BUILDS)
def test_coalescing_joins_both_neighbours_but_never_across_a_boundary(FreeList):
    fl, b = FreeList(), {BASE + 8 * G}
    fl.insert(BASE, 4 * G, b)
    fl.insert(BASE + 8 * G, 4 * G, b)
    fl.insert(BASE + 4 * G, 4 * G, b)  # joins the block before it; the one after starts a chunk
    assert sorted((p, s) for s, p in fl.blocks()) == [(BASE, 8 * G), (BASE + 8 * G, 4 * G)]
    fl.insert(BASE + 12 * G, 4 * G, b)
    assert sorted((p, s) for s, p in fl.blocks()) == [(BASE, 8 * G), (BASE + 8 * G, 8 * G)]
    assert _sizes(fl) == [8 * G] and len(fl.blocks()) == 2 and fl.total() == 16 * G


@pytest.mark.parametrize("FreeList", BUILDS)
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("tf"), st.integers(1, 40)), max_size=120),
       st.sets(st.integers(1, 15), max_size=4))
def test_against_a_byte_model(FreeList, ops, cuts):
    """Random takes and frees over 16 chunks of 16 grains: every byte is free in the index exactly
    when the model says so, each take is a best fit, and coalescing is complete."""
    boundaries = {BASE + c * 16 * G for c in cuts}
    fl, free, live = FreeList(), set(range(256)), []
    for start, end in _runs(free, boundaries):
        fl.add(BASE + start * G, (end - start) * G)
    for kind, n in ops:
        blocks = _check(fl, boundaries)
        if kind == "t":
            fitting = [s for _, s in blocks if s >= n * G]
            ptr = fl.take(n * G)
            if not fitting:
                assert ptr is None
                continue
            assert ptr is not None
            got = [s for p, s in blocks if p == ptr][0]
            assert got == min(fitting), "not a best fit"
            assert ptr == min(p for p, s in blocks if s == got), "not the lowest block of its size"
            first = (ptr - BASE) // G
            assert set(range(first, first + n)) <= free
            free -= set(range(first, first + n))
            live.append((ptr, n))
        elif live:
            ptr, m = live.pop(n % len(live))
            fl.insert(ptr, m * G, boundaries)
            first = (ptr - BASE) // G
            free |= set(range(first, first + m))
    blocks = _check(fl, boundaries)
    assert {(p - BASE) // G + k for p, s in blocks for k in range(s // G)} == free
    assert fl.total() == len(free) * G


def _runs(free, boundaries):
    """The maximal runs of free grains, split at boundaries (grain indices)."""
    cuts = {(b - BASE) // G for b in boundaries}
    runs, start = [], None
    for g in range(257):
        if g in free and (start is None or g not in cuts):
            if start is None:
                start = g
            continue
        if start is not None:
            runs.append((start, g))
            start = g if g in free else None
    return runs


@pytest.mark.skipif(_hotc is None, reason="the compiled core is not built here")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("tfscx"), st.integers(1, 40), st.integers(0, 255)), max_size=120),
       st.sets(st.integers(1, 15), max_size=4))
def test_the_compiled_free_list_answers_as_the_python_one(ops, cuts):
    """The twins side by side on one random sequence: every take (with and without a spare), cut,
    free, candidates, neighbour lookup and walk gives the same answer, and absorbing a second list
    leaves the same blocks."""
    boundaries = {BASE + c * 16 * G for c in cuts}
    py, cc = _freelist.FreeList(), _hotc.FreeList()
    for fl in (py, cc):
        fl.insert(BASE, 256 * G, boundaries)  # boundaries split nothing at insert: one block
    live = []
    for kind, n, at in ops:
        blocks = py.items()
        assert cc.items() == blocks and cc.blocks() == py.blocks() and len(cc) == len(py)
        assert cc.total() == py.total() and cc.largest() == py.largest() and cc.fits(n * G) == py.fits(n * G)
        assert cc.candidates(n * G, 3) == py.candidates(n * G, 3)
        p = BASE + at * G
        assert cc.size_at(p) == py.size_at(p) and cc.ending_at(p) == py.ending_at(p)
        if kind in "ts":
            spare = blocks[at % len(blocks)][0] if kind == "s" and blocks else None
            got = py.take(n * G, spare)
            assert cc.take(n * G, spare) == got
            if got is not None:
                live.append((got, n * G))
        elif kind == "c" and blocks:  # cut n grains from the middle of a block that holds them
            block, bsize = blocks[at % len(blocks)]
            if bsize >= n * G:
                off = (at % (bsize // G - n + 1)) * G
                assert cc.cut(block, block + off, n * G) == py.cut(block, block + off, n * G)
                live.append((block + off, n * G))
        elif kind == "x" and live:  # hand half the live blocks to a second list, then absorb it
            other_py, other_cc = _freelist.FreeList(), _hotc.FreeList()
            for ptr, size in live[::2]:
                other_py.insert(ptr, size, boundaries)
                other_cc.insert(ptr, size, boundaries)
            live = live[1::2]
            py, cc = py.absorb(other_py, boundaries), cc.absorb(other_cc, boundaries)
        elif live:
            ptr, size = live.pop(n % len(live))
            py.insert(ptr, size, boundaries)
            cc.insert(ptr, size, boundaries)
    assert cc.items() == py.items() and cc.blocks() == py.blocks()


@pytest.mark.skipif(_hotc is None, reason="the compiled core is not built here")
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_free_list_agrees_across_many_leaves(seed):
    """Thousands of free blocks (the compiled indexes hold 64 keys a leaf): leaves split as blocks are
    freed apart, merge and empty as they are taken, and keys move across leaves as blocks are cut and
    joined; the twins agree after every step, and every byte comes back as one block."""
    import random
    rnd = random.Random(seed)
    boundaries = {BASE + c * 4096 * G for c in range(1, 4)}
    py, cc = _freelist.FreeList(), _hotc.FreeList()
    for fl in (py, cc):  # four chunks, as a pool grows
        for c in range(4):
            fl.insert(BASE + c * 4096 * G, 4096 * G, boundaries)
    live, peak = [], 0
    for step in range(6000):
        if step < 2500 or rnd.random() < 0.4 or not live:  # fill, then free at random (holes everywhere)
            n = rnd.choice((1, 2, 3, rnd.randint(1, 64))) * G
            got = py.take(n)
            assert cc.take(n) == got
            if got is not None:
                live.append((got, n))
        else:
            ptr, n = live.pop(rnd.randrange(len(live)))
            py.insert(ptr, n, boundaries)
            cc.insert(ptr, n, boundaries)
        peak = max(peak, len(cc))
        if step % 97 == 0:
            assert cc.items() == py.items() and cc.blocks() == py.blocks()
            assert len(cc) == len(py) and cc.total() == py.total() and cc.largest() == py.largest()
            q = rnd.randrange(16384) * G
            assert cc.fits(q or G) == py.fits(q or G) and cc.candidates(q or G, 5) == py.candidates(q or G, 5)
    for ptr, n in live:
        py.insert(ptr, n, boundaries)
        cc.insert(ptr, n, boundaries)
    assert peak > 200, "the workload did not spread over several leaves"
    assert cc.items() == py.items() == [(BASE + c * 4096 * G, 4096 * G) for c in range(4)]
    _check(cc, boundaries)
