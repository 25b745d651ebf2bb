"""Controlled thread interleavings, in the spirit of loom and Shuttle (Rust) and CHESS.

Several real threads run a test, but only one at a time: each stops at every *scheduling point* and a
:class:`Schedule` says which thread runs next. The points are

* every line executed in the code under test (by default the mrkit package outside its testing kit
  and drivers, plus the modules of the resources in the stack: so a user's own resource is covered),
  seen through ``sys.settrace`` in the controlled threads only: a lock-free step of the engine
  (``lst = cache.get(size)``, ``lst.append(ptr)``, ``if st.cache is cache``) is one line;
* every acquisition of a lock made inside :func:`controlled_locks` (the kit builds the resource under
  test there, so its ``threading.Lock``/``RLock`` objects are :class:`ControlledLock`): a thread that
  finds the lock held is *blocked* until its holder releases it, and the others run meanwhile.

Production code pays nothing: no hook, flag or branch is added to mrkit's paths; outside a controlled
run a :class:`ControlledLock` is a plain lock (one Python call more per acquisition, only for resources
built inside :func:`controlled_locks`).

A schedule is a list of *segments* ``(thread, steps)``: run ``thread`` for ``steps`` scheduling points,
then the next segment. When the segments are used up, the thread running goes on to its end, then the
others in turn. A blocked or finished thread hands over to the next runnable one (round robin). So the
number of segments is the number of switches the test chose; Hypothesis shrinks a failing schedule to
the fewest and shortest, and ``str(schedule)`` (``"1x4 0x2"``) replays it exactly
(:meth:`Schedule.parse`), as does ``Schedule.from_seed(seed, threads)``.
"""
from __future__ import annotations

import dis
import functools
import linecache
import os
import random
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .._engine import python_core

__all__ = ["Schedule", "ControlledLock", "controlled_locks", "run_controlled", "InterleavingError",
           "Step", "default_points"]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the mrkit package
# mrkit's code with shared state: the engine, resources, adaptors, integrations, current resources
_INCLUDED = tuple(os.path.join(_PKG, d) + os.sep for d in ("_engine", "resources", "adaptors", "integrations")) + (
    os.path.join(_PKG, "_current.py"), os.path.join(_PKG, "statistics.py"))
# opcodes that touch something other than the frame's own variables (attributes, items, calls,
# containers, context managers, iteration): a line without any of them cannot race, and a switch
# before it is the same as a switch after it, so it is not a scheduling point
_SHARED_OPS = frozenset(n for n in dis.opmap if n.startswith((
    "LOAD_ATTR", "STORE_ATTR", "DELETE_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "CALL", "BINARY_SUBSCR",
    "STORE_SUBSCR", "DELETE_SUBSCR", "BINARY_SLICE", "STORE_SLICE", "BEFORE_WITH", "SETUP_WITH",
    "FOR_ITER", "CONTAINS_OP", "IMPORT_NAME", "STORE_GLOBAL", "STORE_DEREF", "YIELD_VALUE", "SEND",
    "UNPACK_SEQUENCE", "GET_ITER")))
# inside a critical section (a controlled lock held) only lines that write shared state are points:
# the other threads can only run lock-free code meanwhile, which sees the section's writes, not its reads
_STORE_OPS = frozenset(n for n in dis.opmap if n.startswith((
    "STORE_ATTR", "DELETE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE", "STORE_GLOBAL", "STORE_DEREF")))

_HAS_POSITIONS = sys.version_info >= (3, 11)  # dis.Instruction.positions

_RealLock = threading.Lock
_RealRLock = threading.RLock
_active: "Controller | None" = None  # the controlled run in progress (one at a time per process)


def default_points(extra_files: Iterable[str] = ()) -> Callable[[str], bool]:
    """The files whose lines are scheduling points: mrkit's engine, resources, adaptors and
    integrations (not its testing kit, drivers or pure helpers), and ``extra_files`` (the kit adds the
    modules of the resources under test, so a user's own resource is covered)."""
    extra = {os.path.abspath(f) for f in extra_files}

    def included(filename: str) -> bool:
        return filename in extra or filename.startswith(_INCLUDED)
    return included


@functools.lru_cache(maxsize=None)
def _shared_lines(code) -> tuple[frozenset, frozenset]:
    """The lines of ``code`` that touch shared state (see ``_SHARED_OPS``), and those that write it
    (``_STORE_OPS``)."""
    lines, stores = set(), set()
    line = None
    for ins in dis.get_instructions(code):
        if _HAS_POSITIONS:
            line = ins.positions.lineno if ins.positions is not None else None
        elif ins.starts_line is not None:  # Python 3.10: the line is set on its first instruction only
            line = ins.starts_line
        if line is None:
            continue
        if ins.opname in _SHARED_OPS:
            lines.add(line)
        if ins.opname in _STORE_OPS:
            stores.add(line)
    return frozenset(lines), frozenset(stores)


@dataclass(frozen=True)
class Schedule:
    """Which thread runs for how many scheduling points: ``segments`` of ``(thread, steps)``."""

    segments: tuple[tuple[int, int], ...] = ()

    def __str__(self) -> str:
        return " ".join(f"{t}x{'*' if n < 0 else n}" for t, n in self.segments) or "(no switches)"

    @classmethod
    def parse(cls, text: str) -> "Schedule":
        """The schedule ``str(schedule)`` printed, e.g. ``"1x4 0x2"``."""
        text = text.strip()
        if text in ("", "(no switches)"):
            return cls()
        segs = []
        for part in text.split():
            t, sep, n = part.partition("x")
            if not sep or not t.isdigit() or not (n.isdigit() or n == "*"):
                raise ValueError(f"schedule: {part!r} is not THREADxSTEPS or THREADx* (in {text!r})")
            segs.append((int(t), -1 if n == "*" else int(n)))
        return cls(tuple(segs))

    @classmethod
    def from_seed(cls, seed: int, threads: int, switches: int = 6, longest: int = 40) -> "Schedule":
        """A random schedule, the same for the same arguments (runs without Hypothesis)."""
        rng = random.Random(seed)
        return cls(tuple((rng.randrange(threads), rng.randint(0, longest))
                         for _ in range(rng.randint(0, switches))))

    @staticmethod
    def strategy(threads: int, max_switches: int = 8, longest: int = 60):
        """A Hypothesis strategy of schedules for ``threads`` threads: segments of up to ``longest``
        steps (a precise preemption) or ``*`` (until the thread ends or blocks: a whole critical
        section); shrinks towards fewer, shorter segments, that is fewer switches."""
        from hypothesis import strategies as st
        seg = st.tuples(st.integers(0, threads - 1), st.one_of(st.integers(0, longest), st.just(-1)))
        return st.lists(seg, max_size=max_switches).map(lambda s: Schedule(tuple(s)))


@dataclass
class Step:
    """One scheduling point: which thread, what it was about to do, where."""

    thread: int
    kind: str  # "line", "acquire", "blocked", "start", "end"
    filename: str
    lineno: int
    held: int = 0  # controlled locks the thread held there (inside a critical section when > 0)

    def describe(self) -> str:
        src = linecache.getline(self.filename, self.lineno).strip() if self.lineno else ""
        where = f"{_short(self.filename)}:{self.lineno}" if self.lineno else ""
        what = {"line": "", "acquire": "acquire lock: ", "blocked": "BLOCKED on lock: ",
                "start": "starts", "end": "ends"}[self.kind]
        return f"T{self.thread} {where:<34} {what}{src}".rstrip()


def _short(filename: str) -> str:
    if filename.startswith(_PKG):
        return "mrkit/" + os.path.relpath(filename, _PKG)
    return os.path.basename(filename)


class RunAbandoned(BaseException):
    """Raised in a controlled thread blocked on a :class:`ControlledLock` when the run ended in a
    deadlock, so that every thread unwinds (releasing what it holds) and ends."""


class InterleavingError(AssertionError):
    """A controlled run failed: a thread raised, the threads deadlocked, or a check failed after
    them. Carries the schedule that replays it and the interleaving (the steps around each switch)."""

    def __init__(self, message: str, schedule: Schedule, steps: list[Step], cause: BaseException | None = None):
        self.schedule, self.steps, self.cause = schedule, steps, cause
        super().__init__(f"{message}\n{format_interleaving(steps)}\nreplay: Schedule.parse({str(schedule)!r})")


def format_interleaving(steps: Sequence[Step], context: int = 3, limit: int = 80) -> str:
    """The interleaving as a table: each switch, with the ``context`` steps either side."""
    if not steps:
        return "interleaving: (no scheduling points)"
    keep = set()
    for i in range(1, len(steps)):
        if steps[i].thread != steps[i - 1].thread:
            keep.update(range(max(0, i - context), min(len(steps), i + context)))
    keep.update(range(max(0, len(steps) - context), len(steps)))
    lines, last = [f"interleaving ({len(steps)} steps; switches marked >>):"], -1
    for i in sorted(keep):
        if i != last + 1:
            lines.append("    ...")
        mark = ">>" if i and steps[i].thread != steps[i - 1].thread else "  "
        lines.append(f"  {mark} #{i:<4} {steps[i].describe()}")
        last = i
        if len(lines) > limit:
            lines.append("    ... (cut)")
            break
    return "\n".join(lines)


class _Thread:
    __slots__ = ("index", "go", "state", "blocked_on", "error", "result", "thread", "busy", "held")

    def __init__(self, index: int) -> None:
        self.index = index
        self.go = threading.Semaphore(0)
        self.state = "ready"  # ready, blocked, done
        self.blocked_on = None
        self.error: BaseException | None = None
        self.result = None
        self.thread: threading.Thread | None = None
        self.busy = False  # inside the scheduler's own checks: no scheduling points
        self.held = 0  # controlled locks held


class Controller:
    """One controlled run (see :func:`run_controlled`). The decisions are made by the running thread
    itself at each scheduling point (a switch hands over with one semaphore; staying costs no thread
    switch); the caller's thread only starts the threads and waits for the outcome."""

    def __init__(self, schedule: Schedule, points: Callable[[str], bool], max_steps: int, stall: float,
                 on_step: Callable[[], None] | None) -> None:
        self.schedule = schedule
        self.points = points
        self.max_steps = max_steps
        self.stall = stall
        self.on_step = on_step
        self.steps: list[tuple] = []  # (thread, kind, filename, lineno)
        self.finished = threading.Event()
        self.tls = threading.local()
        self.free_run = False
        self.deadlocked = False
        self.failure: BaseException | str | None = None
        self.threads: list[_Thread] = []
        self.segments = list(schedule.segments)
        self.seg_left = 0
        self._codes: dict = {}

    # -- in the controlled threads ---------------------------------------------------------------
    def me(self) -> _Thread | None:
        if self.free_run:
            return None
        t = getattr(self.tls, "t", None)
        return None if t is None or t.busy else t

    def yield_(self, t: _Thread, kind: str, filename: str, lineno: int) -> None:
        """A scheduling point of ``t`` (the running thread): record it, check, pick who runs next."""
        steps = self.steps
        steps.append((t.index, kind, filename, lineno, t.held))
        if self.on_step is not None and kind != "blocked":
            t.busy = True
            try:
                self.on_step()
            except BaseException as exc:  # noqa: BLE001 - the run stops; the caller raises it
                self.fail(exc)
                return
            finally:
                t.busy = False
        if len(steps) > self.max_steps:
            self.fail(f"more than {self.max_steps} scheduling points: a livelock?")
            return
        nxt = self.pick(t)
        if nxt is not t and nxt is not None:
            nxt.go.release()
            t.go.acquire()

    def pick(self, t: _Thread) -> "_Thread | None":
        """Who runs after ``t``'s scheduling point (``t`` when it stays)."""
        threads = self.threads
        if t.state == "ready":
            if self.seg_left > 0:
                self.seg_left -= 1
                return t
            if self.segments:  # the next segment: a switch (or a stay, when it names t)
                k, n = self.segments.pop(0)
                self.seg_left = n if n >= 0 else 1 << 62
                cand = threads[k % len(threads)]
                return cand if cand.state == "ready" else t
            self.seg_left = 1 << 62  # no segments left: run on to the end
            return t
        self.seg_left = 0  # blocked or done: its segment ends; the next runnable one runs
        order = threads[t.index + 1:] + threads[:t.index + 1]
        for c in order:
            if c.state == "ready":
                return c
        if any(c.state != "done" for c in threads):
            self.deadlocked = True
            self.fail("deadlock: every thread is blocked on a lock: " + ", ".join(
                f"T{c.index} on {c.blocked_on!r}" for c in threads if c.state == "blocked"))
        else:
            self.finished.set()
        return None

    def fail(self, failure) -> None:
        """Stop scheduling: every thread runs on to its end, unscheduled."""
        if self.failure is None:
            self.failure = failure
        self.free_run = True
        for c in self.threads:
            c.go.release()
        self.finished.set()

    def _tracer(self, t: _Thread):
        """``sys.settrace``'s function for ``t``'s thread: a frame of code under test gets a line
        tracer; each of its lines that touches shared state is a scheduling point. A point where ``t``
        simply stays (its segment goes on, no per-step check) is recorded right here, with no further
        call: the run is dominated by these."""
        codes, points, steps = self._codes, self.points, self.steps
        record, index = steps.append, t.index

        def line(frame, event, arg):
            if event == "line" and not t.busy and not self.free_run:
                code = frame.f_code
                lineno = frame.f_lineno
                if lineno in codes[code][1 if t.held else 0]:
                    if self.seg_left > 0 and self.on_step is None and len(steps) < self.max_steps:
                        record((index, "line", code.co_filename, lineno, t.held))
                        self.seg_left -= 1  # what pick() does for a ready thread with steps left
                    else:
                        self.yield_(t, "line", code.co_filename, lineno)
            return line

        def call(frame, event, arg):
            code = frame.f_code
            try:
                lines = codes[code]
            except KeyError:
                lines = codes[code] = _shared_lines(code) if points(code.co_filename) else None
            return line if lines else None
        return call

    def _body(self, t: _Thread, fn: Callable[[], object]) -> None:
        self.tls.t = t
        t.go.acquire()
        sys.settrace(self._tracer(t))
        try:
            t.result = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's thread
            t.error = exc
        finally:
            sys.settrace(None)
            t.state = "done"
            self.steps.append((t.index, "end", "", 0))
            if t.error is not None:
                self.fail(t.error)
            elif not self.free_run:
                nxt = self.pick(t)
                if nxt is not None:
                    nxt.go.release()
            if all(c.state == "done" for c in self.threads):
                self.finished.set()

    # -- the caller's thread --------------------------------------------------------------------
    def run(self, bodies: Sequence[Callable[[], object]]) -> list:
        threads = self.threads = [_Thread(i) for i in range(len(bodies))]
        for t, fn in zip(threads, bodies):
            t.thread = threading.Thread(target=self._body, args=(t, fn), name=f"mrkit-controlled-{t.index}",
                                        daemon=True)
            t.thread.start()
        first = threads[0]
        if self.segments:
            k, n = self.segments.pop(0)
            self.seg_left = n if n >= 0 else 1 << 62
            first = threads[k % len(threads)]
        first.go.release()
        seen = -1
        while not self.finished.wait(self.stall):
            if len(self.steps) == seen:
                running = [t.index for t in threads if t.state == "ready"]
                self.fail(f"no progress for {self.stall:.0f} s (threads {running} blocked outside the "
                          "scheduler: a lock not made inside controlled_locks?)")
                break
            seen = len(self.steps)
        for t in threads:
            t.thread.join(timeout=max(self.stall, 1.0))
        steps = [Step(*s) for s in self.steps]
        failure = self.failure
        if failure is not None:
            if isinstance(failure, BaseException):
                who = next((t.index for t in threads if t.error is failure), None)
                what = (f"thread {who} raised {type(failure).__name__}: {failure}" if who is not None
                        else f"check failed during the run: {type(failure).__name__}: {failure}")
                raise InterleavingError(what, self.schedule, steps, failure) from failure
            raise InterleavingError(failure, self.schedule, steps)
        self.steps = steps
        return [t.result for t in threads]


def run_controlled(bodies: Sequence[Callable[[], object]], schedule: Schedule | str = Schedule(), *,
                   points: Callable[[str], bool] | None = None, max_steps: int = 20000, stall: float = 10.0,
                   on_step: Callable[[], None] | None = None) -> tuple[list, list[Step]]:
    """Run ``bodies`` (2–4 callables), each in its own thread, one at a time as ``schedule`` says.

    Returns ``(results, steps)``. Raises :class:`InterleavingError` (with the interleaving and the
    schedule that replays it) when a body raises, the threads deadlock on :class:`ControlledLock`\\ s,
    or ``on_step()`` (called by the controller after every scheduling point, while every thread is
    stopped: a place to check invariants) raises."""
    global _active
    if isinstance(schedule, str):
        schedule = Schedule.parse(schedule)
    if _active is not None:
        raise RuntimeError("run_controlled: another controlled run is in progress")
    ctl = Controller(schedule, points or default_points(), max_steps, stall, on_step)
    _active = ctl
    try:
        results = ctl.run(bodies)
    finally:
        _active = None
    return results, ctl.steps


class ControlledLock:
    """A lock whose acquisitions are scheduling points in a controlled run (and a plain lock
    elsewhere). ``reentrant=True`` behaves as ``threading.RLock``."""

    __slots__ = ("_lock", "_reentrant", "_owner", "_count", "__weakref__")

    def __init__(self, reentrant: bool = False) -> None:
        self._lock = _RealLock()
        self._reentrant = reentrant
        self._owner = None
        self._count = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self._reentrant and self._owner == me:
            self._count += 1
            return True
        ctl = _active
        t = ctl.me() if ctl is not None else None
        if t is None:
            if not self._lock.acquire(blocking, timeout):
                return False
        else:
            f = sys._getframe(1)
            if f.f_code.co_name == "__enter__":
                f = f.f_back
            ctl.yield_(t, "acquire", f.f_code.co_filename, f.f_lineno)
            while not self._lock.acquire(False):
                if not blocking:
                    return False
                if ctl.free_run:  # the run was abandoned: an ordinary lock from here on, unless
                    if ctl.deadlocked:  # the threads are deadlocked: then each unwinds
                        raise RunAbandoned("the controlled run ended in a deadlock")
                    self._lock.acquire()
                    break
                t.state, t.blocked_on = "blocked", self
                ctl.yield_(t, "blocked", f.f_code.co_filename, f.f_lineno)
            t.held += 1
        self._owner, self._count = me, 1
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("release of a lock this thread does not hold")
        self._count -= 1
        if self._count:
            return
        self._owner = None
        self._lock.release()
        ctl = _active
        if ctl is not None:
            t = getattr(ctl.tls, "t", None)
            if t is not None and t.held:
                t.held -= 1
            for t in _waiting_on(ctl, self):
                t.state, t.blocked_on = "ready", None

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def _is_owned(self) -> bool:
        """Whether the calling thread holds the lock (as ``threading.RLock`` has it)."""
        return self._owner == threading.get_ident()

    def __repr__(self) -> str:
        return f"<ControlledLock {'held' if self._owner else 'free'}>"


def _waiting_on(ctl: Controller, lock: ControlledLock) -> list[_Thread]:
    return [t for t in ctl.threads if t.blocked_on is lock]


@contextmanager
def controlled_locks():
    """Inside this block ``threading.Lock()`` and ``threading.RLock()`` make :class:`ControlledLock`
    objects: build the resource under test here and its locks become scheduling points. mrkit's
    caching resources built here run the engine's Python build (its lock-free steps are Python lines,
    so they are scheduling points; the compiled build has the same semantics)."""
    threading.Lock = lambda: ControlledLock()  # type: ignore[assignment]
    threading.RLock = lambda: ControlledLock(reentrant=True)  # type: ignore[assignment]
    try:
        with python_core():
            yield
    finally:
        threading.Lock, threading.RLock = _RealLock, _RealRLock  # type: ignore[assignment]
