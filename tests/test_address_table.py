"""The compiled build's live table (``_hotc.AddressTable``): the same answers as a ``dict`` for every
sequence of operations, its storage grown and shrunk without losing an entry, runs that wrap past the
last slot kept findable when an entry leaves, each object held exactly once, bad keys and values
refused without a change, and no entry lost or doubled when threads share it."""
from __future__ import annotations

import collections.abc
import sys
import threading

import pytest
from hypothesis import given, settings, strategies as st

try:
    from mrkit._engine import _hotc
except ImportError:
    _hotc = None

pytestmark = pytest.mark.skipif(_hotc is None, reason="the compiled core is not built here")
BASE = 0x7F00_0000_0000


def _home(key: int, capacity: int) -> int:
    """The slot a key hashes to (the table's multiplicative hash: the top bits of key * 2**64/phi)."""
    return ((key * 0x9E3779B97F4A7C15) % (1 << 64)) >> (64 - capacity.bit_length() + 1)


def _same(table, model: dict) -> None:
    assert len(table) == len(model) and table == model and table.copy() == model
    assert sorted(table.items()) == sorted(model.items()) and sorted(table) == sorted(model)
    for k, v in model.items():
        assert k in table and table[k] == v and table.get(k) == v


ops = st.lists(st.tuples(st.sampled_from(["set", "pop", "del", "get"]),
                         st.integers(0, 40).map(lambda i: BASE + 512 * i), st.integers(0, 1 << 40)),
               max_size=300)


@given(ops)
@settings(max_examples=150, deadline=None)
def test_answers_as_a_dict(seq):
    table, model = _hotc.AddressTable(), {}
    for op, k, v in seq:
        if op == "set":
            table[k] = model[k] = v
        elif op == "pop":
            assert table.pop(k, None) == model.pop(k, None)
        elif op == "del":
            if k in model:
                del table[k], model[k]
            else:
                with pytest.raises(KeyError):
                    del table[k]
        else:
            assert table.get(k, -1) == model.get(k, -1)
        assert len(table) == len(model)
    _same(table, model)


def test_wrapped_runs_stay_findable_after_a_removal():
    """Keys whose home is the last slot run past it into the first slots: taking any one out (the
    backward shift) leaves every other key where a look-up finds it, in any order of removal."""
    last = [BASE + 256 * i for i in range(1 << 16) if _home(BASE + 256 * i, 16) == 15][:5]
    first = [BASE + 256 * i for i in range(1 << 16) if _home(BASE + 256 * i, 16) == 0][:2]
    keys = last + first
    for start in range(len(keys)):
        order = keys[start:] + keys[:start]
        table = _hotc.AddressTable()
        for k in keys:
            table[k] = k & 0xFFFF
        assert table.capacity == 16
        model = {k: k & 0xFFFF for k in keys}
        for k in order:
            assert table.pop(k) == model.pop(k)
            _same(table, model)


def test_grows_and_shrinks_without_losing_an_entry():
    table, model = _hotc.AddressTable(), {}
    for i in range(40_000):
        table[BASE + 256 * i] = model[BASE + 256 * i] = i
    assert table.capacity == 1 << 17 and table == model  # at most half full
    for i in range(39_990):
        assert table.pop(BASE + 256 * i) == model.pop(BASE + 256 * i)
        if i % 4999 == 0:
            _same(table, model)
    _same(table, model)
    assert table.capacity == 1 << 15  # halved while a sixteenth would do, down to 32 768 slots
    small = _hotc.AddressTable()
    for _ in range(3):  # a batch made and freed again and again keeps its storage
        for i in range(1000):
            small[BASE + 256 * i] = i
        for i in range(1000):
            del small[BASE + 256 * i]
        assert small.capacity == 2048 and len(small) == 0


def test_objects_are_held_once_and_given_back():
    stream = object()
    table = _hotc.AddressTable(objects=True)
    before = sys.getrefcount(stream)
    for i in range(100):
        table[BASE + 256 * i] = stream
    assert sys.getrefcount(stream) == before + 100 and table.objects
    table[BASE] = stream  # replaced by itself: still one reference for the slot
    assert sys.getrefcount(stream) == before + 100
    got = table.pop(BASE)  # (no temporaries in the asserts: pytest's rewriting keeps them)
    assert got is stream
    del got
    assert sys.getrefcount(stream) == before + 99
    values = table.values()
    assert sys.getrefcount(stream) == before + 99 + 99
    assert values == [stream] * 99
    del table[BASE + 256]
    table.clear()
    assert len(table) == 0 and sys.getrefcount(stream) == before + 99  # the list of values above
    for i in range(10):
        table[BASE + 256 * i] = stream
    del table
    assert sys.getrefcount(stream) == before + 99


class _Index:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_bad_keys_and_values_change_nothing():
    table = _hotc.AddressTable()
    table[BASE] = 4096
    for key in ("a", 1.5, -256, (1 << 64) - 1, 1 << 64, None):
        assert key not in table and table.get(key, "none") == "none" and table.pop(key, "none") == "none"
        with pytest.raises(KeyError):
            table[key]
        with pytest.raises(TypeError, match="block address"):
            table[key] = 1
    for value in (-1, 1 << 64, "4096"):
        with pytest.raises((ValueError, TypeError), match="size"):
            table[BASE + 256] = value
    assert table == {BASE: 4096}
    assert table[_Index(BASE)] == 4096 and _Index(BASE) in table  # as a dict finds an equal int
    assert isinstance(table, collections.abc.MutableMapping) and table != {BASE: 1} and table != [BASE]
    with pytest.raises(TypeError):
        hash(table)


def test_threads_lose_and_double_nothing(switch_often):
    """Eight threads insert and take out their own addresses, interleaved a microsecond apart in one
    table: each take finds what its thread put, and the table ends empty."""
    table, errors = _hotc.AddressTable(), []

    def work(t):
        try:
            mine = [BASE + (t << 32) + 256 * i for i in range(500)]
            for _ in range(20):
                for k in mine:
                    table[k] = t
                for k in mine:
                    if table.pop(k) != t:
                        errors.append(k)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and len(table) == 0 and table == {}
