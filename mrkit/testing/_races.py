"""Race tests: 2–4 host threads drive one resource in an interleaving Hypothesis chooses.

Each example builds a fresh resource (its locks made inside :func:`controlled_locks`), warms its caches
so the lock-free paths are taken, then runs one short *program* per thread under a :class:`Schedule`:
allocate (a size and a stream), free the thread's latest block, a size that misses every cache (it
flushes and steals under the lock), and ``release()``/``trim()``/``trim(wait=False)``. Blocks are filled
by a kernel on their stream and verified by another before they are freed.

Checked at every scheduling point: no limiting adaptor is past its limit. Checked as each allocation
returns: the block overlaps no live block (nothing handed out twice). Checked after the threads:
statistics, limiting and tracking adaptors and the resource's ``live_bytes`` agree with the blocks
live; then everything is freed, every kernel has run without finding wrong bytes, nothing is live,
and after ``release()`` the device has every byte back (conservation).

A failure raises :class:`InterleavingError`: which thread did what, where, around each switch, and the
call that replays it (:func:`replay_race`).
"""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .._errors import OutOfMemoryError
from .._stream import DEFAULT_STREAM, Stream
from ..adaptors import LimitingAdaptor, StatisticsAdaptor, TrackingAdaptor
from ..driver import SimDriver, reset_backend, set_backend
from ._conformance import walk_stack
from ._interleave import InterleavingError, Schedule, controlled_locks, default_points, run_controlled

__all__ = ["race_test", "replay_race", "programs_strategy", "RACE_SIZES", "RACE_EXAMPLES"]

#: sizes the threads allocate (warmed, so they are cached per stream), and one that misses
RACE_SIZES = (256, 4096, 65536, 1 << 18)
_MISS = (1 << 20) + 768
_STREAMS = 4  # 0: the default stream, 1-2: owned streams, 3: a raw handle (mrkit cannot tell if it lives)


def programs_strategy(max_threads: int = 4, max_ops: int = 4):
    """Hypothesis strategy of ``(programs, schedule)``: one program (a list of operations) per thread,
    2 to ``max_threads``, and the interleaving.

    Half the examples are free-form; the other half follow the shape most races need: thread 0 is a
    *worker* (allocate/free pairs of one size on one stream, many times: the lock-free paths, so most
    of its scheduling points lie in a window), the others *disruptors* on the same stream (release,
    trim, a size that misses every cache and so flushes it or steals, or work on another stream)."""
    from hypothesis import strategies as st
    size, stream = st.integers(0, len(RACE_SIZES) - 1), st.integers(0, _STREAMS - 1)
    release = st.tuples(st.just("release"), st.integers(0, 2))
    op = st.one_of(
        st.tuples(st.just("pair"), size, stream, st.integers(1, 8)),
        st.tuples(st.just("batch"), size, stream, st.integers(1, 8)),
        st.tuples(st.just("given"), size, stream, st.integers(1, 8)),
        st.tuples(st.just("alloc"), size, stream),
        st.just(("free",)),
        st.tuples(st.just("miss"), stream),
        release,
    )
    free_form = st.lists(st.lists(op, min_size=1, max_size=max_ops), min_size=2, max_size=max_threads)

    @st.composite
    def roles(draw):
        s = draw(stream)
        disrupt = st.one_of(release, release, st.just(("miss", s)), st.tuples(st.just("pair"), size, stream, st.just(2)))
        # free right away; hold several, then free; free blocks another thread allocated; or a
        # disruptor itself (two releases, or a release and a miss, racing each other under the lock)
        kind = draw(st.sampled_from(["given", "pair", "given", "batch", "disruptor"]))
        if kind == "disruptor":
            worker = draw(st.lists(disrupt, min_size=1, max_size=2))
        else:
            worker = [(kind, draw(size), s, draw(st.integers(2, 8)))]
        others = draw(st.lists(st.lists(disrupt, min_size=1, max_size=2), min_size=1, max_size=max_threads - 1))
        programs = [worker] + others
        # the two shapes of a one-window race: the worker stopped at a step while a disruptor runs
        # whole, or a disruptor stopped at a step (inside its critical section) while the worker runs
        d = draw(st.integers(1, len(others)))
        first, second = draw(st.sampled_from([(0, d), (d, 0)]))
        tail = draw(Schedule.strategy(max_threads, max_switches=2))
        # the step at which ``first`` stops is swept by the test (None), every step of its run
        return programs, Schedule(((first, None), (second, -1)) + tail.segments)

    free_form = st.tuples(free_form, Schedule.strategy(max_threads))
    return st.one_of(roles(), free_form)


@dataclass
class _Run:
    factory: Callable
    programs: Sequence[Sequence[tuple]]
    schedule: Schedule
    live: dict = field(default_factory=dict)  # ptr -> (nbytes, stream, pattern)
    corrupt: list = field(default_factory=list)
    counter: int = 0

    def setup(self) -> None:
        self.driver = _untraced_driver(SimDriver(policy="manual"))
        self.previous = set_backend(self.driver)
        with controlled_locks():
            self.mr = self.factory(self.driver)
        self.stack = walk_stack(self.mr)
        self.limits = [r for r in self.stack if isinstance(r, LimitingAdaptor)]
        dev = self.mr.device_id or 0
        self.device = self.mr.device_accessible
        if self.device:
            self.owned = [Stream.create(dev, driver=self.driver) for _ in range(2)]
            self.raw = self.driver.stream_create(dev, True, 0)  # someone else's stream, seen by handle
            self.streams = [DEFAULT_STREAM, *self.owned, Stream.wrap(self.raw, driver=self.driver)]
        else:
            self.owned, self.raw = [], None
            self.streams = [DEFAULT_STREAM] * _STREAMS
        self.baseline = self.driver.mem_get_info(dev)[0]
        files = set()
        for r in self.stack:
            for cls in type(r).__mro__:
                try:
                    files.add(inspect.getfile(cls))
                except TypeError:
                    pass
        self.points = default_points(files)

    def teardown(self) -> None:
        for s in self.owned:
            s.close()
        if self.raw is not None:
            self.driver.stream_destroy(self.raw)
        set_backend(self.previous) if self.previous is not None else reset_backend()

    # -- what the threads do -------------------------------------------------------------------
    def allocate(self, nbytes: int, stream: Stream, held: list) -> None:
        try:
            ptr = self.mr.allocate(nbytes, stream)
        except OutOfMemoryError:
            return
        for p, (n, _, _) in list(self.live.items()):
            assert ptr + nbytes <= p or p + n <= ptr, (
                f"{ptr:#x}+{nbytes} was handed out while {p:#x}+{n} is live (handed out twice)")
        self.counter += 1
        pattern = self.counter % 255 + 1
        self.live[ptr] = (nbytes, stream, pattern)
        held.append(ptr)
        if self.device:
            self.driver.memset_async(ptr, pattern, nbytes, stream.handle)

    def free(self, ptr: int) -> None:
        nbytes, stream, pattern = self.live.pop(ptr)
        if self.device:
            def report(found, ptr=ptr, nbytes=nbytes, pattern=pattern):
                self.corrupt.append(f"block {ptr:#x}+{nbytes} held {found} instead of {pattern} before its free")
            self.driver.verify_async(ptr, nbytes, pattern, stream.handle, report)
        self.mr.deallocate(ptr, nbytes, stream)

    def release(self, kind: int) -> None:
        mr = self.mr
        if kind == 2 and _accepts_wait(getattr(mr, "trim", None)):
            mr.trim(wait=False)
        elif kind >= 1 and callable(getattr(mr, "trim", None)):
            mr.trim()
        elif callable(getattr(mr, "release", None)):
            mr.release()

    def body(self, program: Sequence[tuple]) -> Callable[[], None]:
        given: dict = {}
        for op in program:
            if op[0] == "given":
                got: list = []
                for _ in range(op[3]):
                    self.allocate(RACE_SIZES[op[1]], self.streams[op[2]], got)
                given[id(op)] = got

        def run():
            held: list = []
            for op in program:
                if op[0] == "alloc":
                    self.allocate(RACE_SIZES[op[1]], self.streams[op[2]], held)
                elif op[0] == "pair":  # allocate and free at once, n times: the lock-free paths
                    for _ in range(op[3]):
                        got: list = []
                        self.allocate(RACE_SIZES[op[1]], self.streams[op[2]], got)
                        if got:
                            self.free(got.pop())
                elif op[0] == "batch":  # allocate n blocks, then free them: frees of blocks held a while
                    got = []
                    for _ in range(op[3]):
                        self.allocate(RACE_SIZES[op[1]], self.streams[op[2]], got)
                    while got:
                        self.free(got.pop())
                elif op[0] == "given":  # free blocks the test's thread allocated before the threads ran
                    for p in given.pop(id(op), ()):
                        self.free(p)
                elif op[0] == "free":
                    if held:
                        self.free(held.pop())
                elif op[0] == "miss":
                    got = []
                    self.allocate(_MISS, self.streams[op[1]], got)
                    if got:
                        self.free(got.pop())
                else:
                    self.release(op[1])
            return held
        return run

    # -- checks ----------------------------------------------------------------------------------
    def check_limits(self) -> None:
        for r in self.limits:
            assert r.used_bytes <= r.limit, f"{r!r} is past its limit: {r.used_bytes} > {r.limit}"

    def check_counts(self) -> None:
        want = sum(n for n, _, _ in self.live.values())
        for r in self.stack:
            if isinstance(r, StatisticsAdaptor):
                got = r.statistics
                assert (got.current_bytes, got.current_count) == (want, len(self.live)), (
                    f"statistics count {got.current_bytes} bytes in {got.current_count} blocks, "
                    f"{want} in {len(self.live)} are live")
            if isinstance(r, LimitingAdaptor):
                assert r.used_bytes == want, f"limiting adaptor counts {r.used_bytes} bytes, {want} are live"
            if isinstance(r, TrackingAdaptor):
                assert r.live_bytes == want, f"tracking adaptor has {r.live_bytes} bytes, {want} are live"
        live = getattr(self.mr, "live_bytes", None)
        if live is not None:
            assert live == want, f"{self.mr!r}.live_bytes is {live}, {want} are live"

    def warm(self) -> None:
        """Make each size the programs allocate hot on its stream (two misses each), so that the
        threads take the lock-free paths."""
        pairs = dict.fromkeys((op[1], op[2]) for p in self.programs for op in p if op[0] in ("alloc", "pair", "batch", "given"))
        for _ in range(2):
            for size, s in pairs:
                held: list = []
                self.allocate(RACE_SIZES[size], self.streams[s], held)
                for p in held:
                    self.free(p)

    def run(self, record: bool = False):
        self.setup()
        try:
            self.warm()
            bodies = [self.body(p) for p in self.programs]
            # the per-step check only where there is a limit to check (it costs a Python call per step)
            on_step = self.check_limits if self.limits else None
            results, steps = run_controlled(bodies, self.schedule, points=self.points, on_step=on_step)
            try:
                self.check_counts()
                for held in results:
                    for p in held:
                        self.free(p)
                for s in self.streams:
                    s.synchronize()
                self.driver.run_all()
                assert not self.corrupt, self.corrupt[0]
                self.check_counts()
                rel = getattr(self.mr, "release", None) or getattr(self.mr, "trim", None)
                if rel is not None:
                    rel()
                self.driver.ctx_synchronize(self.mr.device_id or 0)
                free = self.driver.mem_get_info(self.mr.device_id or 0)[0]
                assert free >= self.baseline, (
                    f"memory was lost: {self.baseline - free} bytes fewer free than before the threads ran")
            except Exception as exc:  # noqa: BLE001 - every finding comes with its interleaving
                raise InterleavingError(f"after the threads: {type(exc).__name__}: {exc}", self.schedule,
                                        steps, exc) from exc
            return steps if record else None
        finally:
            self.teardown()


def _untraced_driver(driver: SimDriver) -> SimDriver:
    """``driver`` with each public method run with the calling thread's tracing off. The simulator is
    not code under test (it has no scheduling points), and a controlled thread traced every call
    inside it: most of a run's time."""
    cls = type(driver)
    quiet = _QUIET.get(cls)
    if quiet is None:
        names = [n for n in dir(cls) if not n.startswith("_") and inspect.isfunction(getattr(cls, n))]
        quiet = _QUIET[cls] = type(f"Untraced{cls.__name__}", (cls,),
                                   {n: _without_tracing(getattr(cls, n)) for n in names})
    driver.__class__ = quiet
    return driver


_QUIET: dict = {}


def _without_tracing(fn):
    gettrace, settrace = sys.gettrace, sys.settrace

    @functools.wraps(fn)
    def call(*args, **kwargs):
        trace = gettrace()
        if trace is None:
            return fn(*args, **kwargs)
        settrace(None)
        try:
            return fn(*args, **kwargs)
        finally:
            settrace(trace)
    return call


def _accepts_wait(fn) -> bool:
    try:
        return fn is not None and "wait" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


_SWEEP = 12  # most runs of one swept example


def _spread(points: Sequence[int], n: int) -> set:
    """``n`` of ``points``, evenly spread (all of them when there are no more)."""
    if len(points) <= n:
        return set(points)
    return {points[i * (len(points) - 1) // (n - 1)] for i in range(n)} if n > 1 else {points[0]}


def _sweep(factory, programs, schedule: Schedule):
    """The schedules to run for one example: itself, or — when its first segment's length is
    ``None`` — one per step of that thread's run (up to ``_SWEEP``): the first thread stopped at each
    scheduling point in turn while the second runs whole. A long run is sampled: half the stops evenly
    over it, half evenly over its steps inside critical sections (where a lock-free thread meets a
    half-done flush, steal or release)."""
    (first, n), *rest = schedule.segments or ((0, 0),)
    if n is not None:
        yield schedule
        return
    dry = _Run(factory, programs, Schedule(((first, -1),)))
    steps = dry.run(record=True)
    k = 0
    while k < len(steps) and steps[k].thread == first % len(programs):
        k += 1
    if k < _SWEEP:
        picks = set(range(k + 1))
    else:
        inside = [i for i in range(k) if steps[i].held]
        half = _SWEEP // 2 if inside else _SWEEP
        picks = _spread(range(k), half) | _spread(inside, _SWEEP - half)
    for i in sorted(picks):
        yield Schedule(((first, i), *rest))


def replay_race(factory: Callable, programs: Sequence[Sequence[tuple]], schedule: Schedule | str) -> None:
    """Run one race example exactly again: the ``programs`` and ``schedule`` a failure printed."""
    if isinstance(schedule, str):
        schedule = Schedule.parse(schedule)
    _Run(factory, [list(map(tuple, p)) for p in programs], schedule).run()


#: examples of the race test per example of the Hypothesis profile (a race example is cheaper than
#: a state-machine run of many steps, and races hide in narrow windows)
RACE_EXAMPLES = 2


def race_test(factory: Callable, *, max_threads: int = 4, settings=None) -> None:
    """Race-test ``factory(driver)``'s resource on the simulator: Hypothesis draws 2 to ``max_threads``
    thread programs and the interleaving, and shrinks a failure to the fewest switches. Runs
    ``RACE_EXAMPLES`` times the examples of ``settings`` (default: the loaded Hypothesis profile).
    Raises :class:`InterleavingError` (or ``AssertionError``) describing what it found."""
    from hypothesis import given
    from hypothesis import settings as Settings

    from . import register_profiles

    register_profiles()
    base = settings if settings is not None else Settings()
    settings = Settings(base, max_examples=base.max_examples * RACE_EXAMPLES)

    @given(example=programs_strategy(max_threads))
    def races(example):
        programs, schedule = example
        try:
            for sched in _sweep(factory, programs, schedule):
                _Run(factory, programs, sched).run()
        except InterleavingError as exc:
            exc.args = (f"{exc.args[0]}\nreplay_race(factory, {programs!r}, {str(exc.schedule)!r})",)
            raise

    settings(races)()
