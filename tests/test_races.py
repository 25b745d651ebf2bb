"""Controlled thread interleavings (mrkit.testing.race_test and its scheduler): the scheduler itself,
the races it found in mrkit's own engine (each a test first), and the kit's race test on the resources
mrkit ships."""
from __future__ import annotations

import threading

import pytest

from mrkit.testing import (
    BUILTIN_FACTORIES, InterleavingError, Schedule, controlled_locks, race_test, replay_race, run_controlled,
)
from mrkit.testing._interleave import default_points
from mrkit.testing._races import _sweep

_SRC = '''
import threading

class Counter:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = 0

    def racy(self):
        v = self.n
        self.n = v + 1

    def safe(self):
        with self.lock:
            v = self.n
            self.n = v + 1
'''


def _build(tmp_path, name: str, src: str, cls: str):
    """An instance of ``cls`` from ``src`` written to a file (so its lines are scheduling points),
    built inside controlled_locks(), and the points predicate for that file."""
    path = tmp_path / name
    path.write_text(src)
    ns: dict = {}
    exec(compile(src, str(path), "exec"), ns)
    with controlled_locks():
        obj = ns[cls]()
    return obj, default_points([str(path)])


@pytest.fixture
def counter(tmp_path):
    return _build(tmp_path, "counter_mod.py", _SRC, "Counter")


def test_a_schedule_decides_the_interleaving_and_replays_exactly(counter):
    c, points = counter
    c.n = 0
    run_controlled([c.racy, c.racy], "", points=points)
    assert c.n == 2  # no switch: one after the other
    c.n = 0
    _, steps = run_controlled([c.racy, c.racy], "0x1 1x*", points=points)
    assert c.n == 1  # thread 0 stopped after reading, before writing: a lost update
    assert [s.thread for s in steps if s.kind == "line"] == [0, 0, 1, 1]
    c.n = 0
    run_controlled([c.racy, c.racy], Schedule.parse(str(Schedule(((0, 1), (1, -1))))), points=points)
    assert c.n == 1


def test_controlled_locks_block_the_other_thread_and_exclude_the_lost_update(counter):
    c, points = counter
    for seed in range(30):
        c.n = 0
        _, steps = run_controlled([c.safe, c.safe, c.safe], Schedule.from_seed(seed, 3), points=points)
        assert c.n == 3
    c.n = 0
    _, steps = run_controlled([c.safe, c.safe], "0x2 1x*", points=points)  # 0 holds the lock, 1 blocks
    assert any(s.kind == "blocked" and s.thread == 1 for s in steps) and c.n == 2


def test_a_failing_thread_reports_the_interleaving_and_the_replay(counter):
    c, points = counter

    def boom():
        c.racy()
        raise ValueError("planted")

    with pytest.raises(InterleavingError) as info:
        run_controlled([c.racy, boom], "1x1 0x*", points=points)
    text = str(info.value)
    assert "thread 1 raised ValueError: planted" in text
    assert ">>" in text and "counter_mod.py" in text and "v = self.n" in text
    assert "replay: Schedule.parse('1x1 0x*')" in text


def test_a_deadlock_is_reported_not_hung(tmp_path):
    src = ("import threading\nclass Two:\n    def __init__(self):\n        self.a = threading.Lock()\n"
           "        self.b = threading.Lock()\n    def ab(self):\n        with self.a:\n            with self.b:\n"
           "                pass\n    def ba(self):\n        with self.b:\n            with self.a:\n                pass\n")
    t, points = _build(tmp_path, "two.py", src, "Two")
    before = threading.active_count()
    with pytest.raises(InterleavingError, match="deadlock"):
        run_controlled([t.ab, t.ba], "0x2 1x*", points=points)
    assert threading.active_count() == before  # the deadlocked threads unwound and ended
    assert not t.a.locked() and not t.b.locked()


def test_schedules_parse_and_refuse_nonsense():
    assert str(Schedule.parse("1x4 0x* 2x0")) == "1x4 0x* 2x0"
    assert Schedule.parse("(no switches)") == Schedule()
    with pytest.raises(ValueError, match="THREADxSTEPS"):
        Schedule.parse("1y4")


# -- races the kit found in mrkit's engine (tests first, then the fixes) --------------------------------
def _sweep_all(name, programs):
    f = BUILTIN_FACTORIES[name]
    found = []
    for sch in _sweep(f, programs, Schedule(((1, None), (0, -1)))):
        try:
            replay_race(f, programs, sch)
        except InterleavingError as exc:
            found.append(f"{sch}: {str(exc).splitlines()[0]}")
    return found


@pytest.mark.parametrize("name", ["pool(device)", "pool(cuda)", "vmm", "statistics(pool(device))"])
@pytest.mark.parametrize("stream", [0, 1, 3])
@pytest.mark.parametrize("release", [0, 1])
def test_a_free_racing_release_is_never_given_back_before_its_stream_is_done(name, stream, release):
    """release() synchronised the streams holding free memory, then merged their lists (and their
    caches) into the default stream's and gave whole chunks back (VMM: unmapped them): a block freed
    lock-free on another stream between the wait and the merge went back with that stream's work still
    queued. Found by the kit's race test; every stopping point of release() is tried."""
    assert _sweep_all(name, [[("given", 0, stream, 2)], [("release", release)]]) == []


@pytest.mark.parametrize("name", ["pool(cuda)", "limiting(pool(cuda), 4 MiB)", "vmm"])
def test_the_race_test_passes_on_shipped_resources(name):
    """The race test alone, on three shipped resources (``python -m mrkit.testing`` runs it after the
    state machine on every one; the mutation suite runs it on the targets of each planted race)."""
    race_test(BUILTIN_FACTORIES[name])


def _lines_probe(obj, box):  # the lines below are counted by the test that follows
    n = len(box)
    obj.count = n
    box[0] = obj.count
    return n


def test_the_scheduling_points_are_the_lines_that_touch_shared_state_on_every_python_version():
    """The kit's scheduling points are source lines; Python 3.10's ``dis`` has no ``positions`` (a line
    is set on its first instruction only), and reading them raised AttributeError inside every
    controlled thread there, so no race was ever found on 3.10."""
    from mrkit.testing._interleave import _shared_lines
    first = _lines_probe.__code__.co_firstlineno
    lines, stores = _shared_lines(_lines_probe.__code__)
    assert sorted(x - first for x in lines) == [1, 2, 3]  # a call, an attribute store, a subscript store
    assert sorted(x - first for x in stores) == [2, 3]
