"""The arena's lock and its miss table, on both builds: the compiled ``_hotc.Lock`` behaves as the
``threading.RLock`` the Python build uses, and ``_hotc.Misses`` answers as ``_hot.Misses``."""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

import mrkit
from mrkit._engine import _hot, core_name
from mrkit.driver import SimDriver

try:
    from mrkit._engine import _hotc
except ImportError:
    _hotc = None

compiled = pytest.mark.skipif(_hotc is None, reason="the compiled core is not built here")
LOCKS = [pytest.param(threading.RLock, id="python"),
         pytest.param(getattr(_hotc, "Lock", None), id="compiled", marks=compiled)]


@pytest.mark.parametrize("make", LOCKS)
def test_the_lock_behaves_as_threading_rlock(make):
    lk = make()
    assert not lk._is_owned()
    assert lk.acquire() is True and lk._is_owned()
    assert lk.acquire(False) is True  # reentrant for its holder
    lk.release()
    assert lk._is_owned()
    other = []
    t = threading.Thread(target=lambda: other.append((lk.acquire(False), lk.acquire(True, 0.01), lk._is_owned())))
    t.start()
    t.join(10)
    assert other == [(False, False, False)]  # another thread neither gets it nor owns it
    with pytest.raises(ValueError):
        lk.acquire(False, 1.0)
    lk.release()
    assert not lk._is_owned()
    with pytest.raises(RuntimeError):
        lk.release()
    with lk:
        assert lk._is_owned()
        with lk:
            assert lk._is_owned()
        assert lk._is_owned()
    assert not lk._is_owned()
    assert lk.acquire(timeout=0.5) is True
    lk.release()


@pytest.mark.parametrize("make", LOCKS)
def test_the_lock_excludes_other_threads_and_lets_them_run_while_they_wait(make):
    """Eight threads add to a counter in read-modify-write steps that yield the GIL between read and
    write: under the lock no update is lost, and a waiting thread does not block the holder (the
    wait releases the GIL, else this would deadlock)."""
    lk, box, n = make(), [0], 200

    def work():
        for _ in range(n):
            with lk:
                v = box[0]
                time.sleep(0)  # another thread runs here, and must wait for the lock
                box[0] = v + 1

    ts = [threading.Thread(target=work) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts)
    assert box[0] == 8 * n and not lk._is_owned()


@compiled
def test_a_compiled_arena_holds_its_lock_through_a_resource_call():
    """The compiled paths take the arena's C lock: a thread that holds it from Python makes another
    thread's allocation wait until it is released."""
    pool = mrkit.PoolResource(mrkit.DeviceMemoryResource(0, driver=SimDriver()))
    if core_name() != "compiled":
        pytest.skip("MRKIT_NO_EXTENSIONS is set: arenas run the Python build")
    assert isinstance(pool.arena.lock, _hotc.Lock)
    got = []
    with pool.arena.lock:
        t = threading.Thread(target=lambda: got.append(pool.allocate(1 << 20, mrkit.DEFAULT_STREAM)))
        t.start()
        t.join(0.2)
        assert t.is_alive() and not got  # waiting for the lock (a miss takes it)
    t.join(10)
    assert len(got) == 1
    pool.deallocate(got[0], 1 << 20, mrkit.DEFAULT_STREAM)
    pool.release()
    assert pool.pool_size == 0


@compiled
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(2, 12),
       st.lists(st.integers(0, 20), min_size=1, max_size=300))
def test_the_compiled_miss_table_answers_as_the_python_one(distance, capacity, sizes):
    py, cc = _hot.Misses(distance, capacity), _hotc.Misses(distance, capacity)
    for s in sizes:
        assert cc.note(s << 8) == py.note(s << 8), s
        assert cc.count == py.count and cc.last == py.last


@pytest.mark.parametrize("make", [pytest.param(_hot.Misses, id="python"),
                                  pytest.param(getattr(_hotc, "Misses", None), id="compiled", marks=compiled)])
def test_a_size_is_hot_when_it_misses_again_within_the_distance(make):
    m = make(3, 100)
    assert not m.note(256)          # first miss
    assert m.note(256)              # again at once
    for s in (512, 768, 1024):
        m.note(s)
    assert not m.note(256)          # four misses later: too far
    m = make(100, 2)
    m.note(256), m.note(512)
    assert not m.note(768) and len(m.last) == 1  # full: starts afresh
    assert not m.note(256)          # forgotten
