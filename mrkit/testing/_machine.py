"""A Hypothesis state machine for allocate/free ordering over any resource.

On the simulator every decision is the test's data: which stream's work runs next (``advance``
draws a list of choices for :meth:`SimDriver.run_choices`), when an upstream allocation fails, how
host threads interleave. A failing run therefore shrinks to a short story — a few allocations and
frees on two streams — and replays exactly from Hypothesis's database or a ``@reproduce_failure``
blob. ``scheduling="seeded"`` keeps the older seeded-random interleavings for users without a
Hypothesis-driven run.

Checks never hide a race: blocks are filled and verified by kernels on their own streams (the
race checker sees each of them, and a verify kernel reports wrong bytes when it runs); the host only
reads a block after synchronising the one stream that owns it, never the whole device.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import os
import threading
from dataclasses import dataclass
from typing import Callable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, precondition, rule,
)

from .._errors import CUDAError, OutOfMemoryError, StreamOrderViolation
from .._resource import MemoryResource
from .._current import get_current_resource, using
from .._stream import DEFAULT_STREAM, Event, Stream
from ..adaptors import LimitingAdaptor, LoggingAdaptor, StatisticsAdaptor, TrackingAdaptor, read_log, replay
from ..integrations.cupy import AllocatorHooks
from ..integrations.torch import AllocatorCallbacks
from ..resources import CudaMemoryResource, VirtualMemoryResource
from ..statistics import profiler, profiler_records
from ..driver import Driver, SimDriver, get_driver, reset_backend, set_backend
from ._conformance import Harness, read_back, walk_stack, write_pattern

__all__ = ["make_state_machine", "default_backend", "checker_canary"]

SIZES = st.one_of(
    st.integers(1, 512),
    st.sampled_from([256, 1000, 4096, 65536, 1 << 20, 4 << 20, 8 << 20]),  # whole pages: VMM runs and moves
    st.integers(513, 3 << 20),
)
INJECTED = "injected by SimDriver.fail_allocation"
_RUNS = itertools.count(1)


def default_backend() -> str:
    """``MRKIT_TEST_BACKEND`` (``sim`` unless set to ``cuda``)."""
    return os.environ.get("MRKIT_TEST_BACKEND", "sim").strip().lower() or "sim"


@dataclass
class _Block:
    ptr: int
    nbytes: int
    alignment: int
    stream: Stream
    pattern: int
    used: bool = False

    def __repr__(self) -> str:
        return f"<block {self.ptr:#x}+{self.nbytes} on {self.stream!r}>"


def _counters(c) -> tuple:
    """A :class:`~mrkit.statistics.Statistics` as (current, peak, total) bytes, then counts."""
    return (c.current_bytes, c.peak_bytes, c.total_bytes, c.current_count, c.peak_count, c.total_count)


def checker_canary(driver: SimDriver) -> None:
    """Prove the simulator's race checker works before trusting its silence: unordered writes on
    two streams, a read racing a write, and a use after free must each raise
    :class:`~mrkit.StreamOrderViolation`; the same work ordered by an event must not."""
    a, b = driver.stream_create(0), driver.stream_create(0)
    p = driver.mem_alloc(0, 4096)
    try:
        driver.memset_async(p, 1, 4096, a)
        for what, op in (("write/write", lambda: driver.memset_async(p, 2, 4096, b)),
                         ("read/write", lambda: driver.touch(p, 4096, b, write=False))):
            try:
                op()
            except StreamOrderViolation:
                continue
            raise AssertionError(f"the race checker missed a {what} race between two unordered streams")
        ev = driver.event_create(0)
        driver.event_record(ev, a)
        driver.stream_wait_event(b, ev)
        driver.memset_async(p, 2, 4096, b)  # ordered by the event: must pass
        driver.stream_synchronize(b)
        driver.event_destroy(ev)
    finally:
        driver.stream_synchronize(a)
        driver.stream_synchronize(b)
        driver.mem_free(p)
    try:
        if driver.device_capability(0, "memory_pools_supported"):
            # stream-ordered memory stays the driver's after its free: any later use is a bug,
            # however well it is ordered
            pool = driver.device_get_default_mem_pool(0)
            q = driver.mem_alloc_from_pool_async(4096, pool, a)
            driver.memset_async(q, 1, 4096, a)
            driver.mem_free_async(q, a)
            try:
                driver.memset_async(q, 3, 16, a)
            except StreamOrderViolation:
                pass
            else:
                raise AssertionError("the race checker missed a use after a stream-ordered free")
            driver.stream_synchronize(a)
    finally:
        driver.stream_destroy(a)
        driver.stream_destroy(b)


def _close_stack(mr) -> None:
    """Close what the run built (pools, VMM reservations, owned driver pools), top down, so that
    thousands of examples do not exhaust a real GPU's memory or virtual address space. A resource
    that refuses (still holding allocations after a failure) is left as it is."""
    for r in walk_stack(mr):
        close = getattr(r, "close", None)
        if callable(close) and not isinstance(r, LoggingAdaptor):
            try:
                close()
            except (ValueError, CUDAError):
                pass


def make_state_machine(factory: Callable[[Driver], MemoryResource], *, backend: str | None = None,
                       max_streams: int = 4, sim_factory: Callable[[int], SimDriver] | None = None,
                       scheduling: str = "hypothesis", faults: bool = True, threads: bool = True,
                       log_roundtrip: bool = True, name: str = "ResourceMachine") -> type:
    """Build a ``RuleBasedStateMachine`` class testing ``factory(driver)``'s resource.

    Rules: allocate (sizes, alignments, streams; optionally filled by a kernel), fill, verify (a
    kernel on the block's stream), free on the block's stream, on another stream ordered by an
    event, or on another stream after the host synchronised the block's; synchronise one stream;
    create and destroy streams (also while the resource holds their freed blocks); ``release()`` and
    ``trim()``; on the simulator, ``advance`` (which ops run, drawn from the test's data), injected
    upstream failures (the n-th driver allocation raises out of memory or a driver error) and bursts
    from two host threads interleaved in an order the data gives.

    Invariants: no two live blocks overlap, every block is aligned, no verify kernel found wrong
    bytes, live bytes agree with a plain model, with every statistics, limiting and tracking adaptor
    in the stack and with the resource's ``live_bytes``, and no limiting adaptor is past its limit.
    The simulator raises on any stream-order violation. Teardown frees everything, proves every byte
    went back (device free memory as at the start), and — with ``log_roundtrip`` — reads the run's
    log back and replays it against a fresh resource with the same outcome.

    ``backend`` is ``"sim"`` or ``"cuda"`` (default: :func:`default_backend`). ``scheduling`` is
    ``"hypothesis"`` (default) or ``"seeded"`` (``sim_factory(seed)`` builds the driver; default: a
    seeded random scheduling policy).
    """
    backend = backend or default_backend()
    if backend not in ("sim", "cuda"):
        raise ValueError(f"backend must be 'sim' or 'cuda', got {backend!r}")
    if scheduling not in ("hypothesis", "seeded"):
        raise ValueError(f"scheduling must be 'hypothesis' or 'seeded', got {scheduling!r}")
    sim = backend == "sim"
    driven = sim and scheduling == "hypothesis" and sim_factory is None
    # two simulated devices: the caller's current device may differ from the resource's
    make_sim = sim_factory or ((lambda seed: SimDriver(devices=2, policy="manual")) if driven
                               else (lambda seed: SimDriver(devices=2, policy="random", seed=seed)))

    class Machine(RuleBasedStateMachine):
        blocks = Bundle("blocks")

        def __init__(self) -> None:
            super().__init__()
            self.mr = None
            self._previous_driver = None

        @initialize(seed=st.integers(0, 2**31 - 1) if not driven else st.just(0))
        def setup(self, seed):
            self.driver = make_sim(seed) if sim else get_driver()
            # the machine's driver is the process's driver until teardown, so DEFAULT_STREAM and
            # resources built with default arguments use it too
            self._previous_driver = set_backend(self.driver)
            if sim:
                checker_canary(self.driver)
            self.mr = factory(self.driver)
            self.api = LoggingAdaptor(self.mr, io.StringIO(), buffer_lines=1 << 30, flush_interval=None) \
                if log_roundtrip else self.mr
            self.h = Harness(self.mr, self.driver)
            self.model: dict[int, _Block] = {}
            self.streams: list[Stream] = [DEFAULT_STREAM]
            if self.mr.device_accessible:  # most ordering bugs need two streams besides the default
                self.streams += [Stream.create(self.mr.device_id or 0, driver=self.driver)
                                 for _ in range(min(2, max_streams - 1))]
            self.counter = 0
            self.peak = self.peak_count = 0  # the run's highest live bytes and live allocations
            # the first statistics adaptor of the stack, and the counter frames pushed on it: each
            # [live bytes, live count, counted bytes, count, highest live bytes, highest live count]
            # as at its push, the last two raised while it is open (RMM's push/pop semantics)
            self.stats = next((r for r in walk_stack(self.mr) if isinstance(r, StatisticsAdaptor)), None)
            self.frames: list[list[int]] = []
            # VMMs with a footprint limit, and the bound their physical memory must stay within: the
            # high-water mark of limit x live bytes (256-byte grain) plus one page per live allocation
            self.limited = [r for r in walk_stack(self.mr) if isinstance(r, VirtualMemoryResource)
                            and r.options.footprint_limit is not None]
            self.footprint_bound = 0
            self.caller = self.mr.device_id or 0  # the device current on the machine's threads when it calls
            self.refusals = 0  # out of memory or injected failures: the replay may differ there
            self.counted_bytes = 0  # bytes of every allocation made (statistics' total_bytes)
            self.profile_name = f"mrkit.testing machine {next(_RUNS)}"  # never reused: records are per process
            self.profile_peak = self.profile_calls = 0
            self._log_pos, self._log_live = 0, {}
            self.corrupt: list[str] = []
            dev = self.mr.device_id or 0
            self.baseline = self.driver.mem_get_info(dev)[0] if sim and self.driver.device_count() else None
            note(f"resource: {self.mr!r}, backend {backend}, scheduling {scheduling if sim else 'gpu'}")

        # -- helpers ---------------------------------------------------------------------
        _thread_notes = None

        def _note(self, msg: str) -> None:
            if self._thread_notes is not None:  # inside two_threads: noted once, from the test's thread
                self._thread_notes.append(msg)
            else:
                note(msg)

        def _stream(self, i: int) -> Stream:
            return self.streams[i % len(self.streams)]

        def _live_bytes(self) -> int:
            return sum(b.nbytes for b in self.model.values())

        def _peaked(self, extra_bytes: int = 0, extra_count: int = 0) -> None:
            """The model's live set (plus blocks allocated outside it, still live) reached a new
            height: the run's peaks and those of every open counter frame follow."""
            b, n = self._live_bytes() + extra_bytes, len(self.model) + extra_count
            self.peak, self.peak_count = max(self.peak, b), max(self.peak_count, n)
            for f in self.frames:
                f[4], f[5] = max(f[4], b), max(f[5], n)
            if self.limited:  # blocks outside the model: their grain counted in full
                grained = sum((m.nbytes + 255) & -256 for m in self.model.values()) + extra_bytes + 256 * extra_count
                for r in self.limited:
                    self.footprint_bound = max(self.footprint_bound, int(r.options.footprint_limit * grained)
                                               + r.page_size * n)

        def _counted_outside(self, n: int) -> None:
            """A block of ``n`` bytes was allocated through the stack but is not in the model (a rule
            frees it itself): counted, and live until its rule frees it."""
            self.counter += 1
            self.counted_bytes += n
            self._peaked(n, 1)

        def _expected_counters(self, frame=None) -> tuple:
            """What the statistics adaptor's counters must be: of ``frame`` (counting from its
            push) or of the whole run, as (current, peak, total) bytes then counts."""
            b, n = self._live_bytes(), len(self.model)
            if frame is None:
                return b, self.peak, self.counted_bytes, n, self.peak_count, self.counter
            b0, n0, tb0, tn0, hb, hn = frame
            return b - b0, hb - b0, self.counted_bytes - tb0, n - n0, hn - n0, self.counter - tn0

        def _fill(self, b: _Block) -> None:
            write_pattern(self.h, b.ptr, b.nbytes, b.pattern, b.stream)
            b.used = True

        def _verify(self, b: _Block) -> None:
            """Check a used block's bytes without ordering anything that was not already ordered."""
            if not b.used:
                return
            if sim and self.mr.device_accessible:
                def report(found, b=b):
                    self.corrupt.append(f"{b!r} held {found} instead of {b.pattern} when its verify kernel ran")
                self.driver.verify_async(b.ptr, b.nbytes, b.pattern, b.stream.handle, report)
            else:  # the GPU, or host memory: read after synchronising this block's stream only
                got = read_back(self.h, b.ptr, b.nbytes, b.stream)
                assert got == bytes([b.pattern]) * b.nbytes, (
                    f"{b!r} was corrupted: expected {b.pattern}, found {sorted(set(got))[:4]}")

        def _as_caller(self):
            """The calls into the resource run with ``self.caller`` current (the default stream then
            means the resource's device's, whatever is current: the resource must scope it)."""
            if sim and self.caller != (self.mr.device_id or 0):
                return self.driver.on_device(self.caller)
            return contextlib.nullcontext()

        def _allocate(self, nbytes, align, s, fill):
            before = self._live_bytes()
            try:
                with self._as_caller():
                    ptr = self.api.allocate(nbytes, s, align)
            except OutOfMemoryError as exc:
                self._note(f"allocate({nbytes}) on {s!r}: out of memory ({str(exc)[:120]})")
                self.refusals += 1
                assert self._live_bytes() == before
                return None
            except CUDAError as exc:
                if INJECTED not in str(exc):
                    raise
                self._note(f"allocate({nbytes}) on {s!r}: injected {exc.name}")
                self.refusals += 1
                return None
            assert ptr % align == 0, f"{ptr:#x} is not {align}-aligned"
            assert ptr not in self.model, f"{ptr:#x} handed out twice"
            self.counter += 1
            self.counted_bytes += nbytes
            b = _Block(ptr, nbytes, align, s, self.counter % 255 + 1)
            self.model[ptr] = b
            self._peaked()
            self._note(f"allocate({nbytes}, align={align}) on {s!r} -> {ptr:#x}")
            if fill:
                self._fill(b)
            return b

        def _free(self, b: _Block, s: Stream) -> None:
            self._note(f"free {b!r} on {s!r}")
            with self._as_caller():
                self.api.deallocate(b.ptr, b.nbytes, s, b.alignment)
            del self.model[b.ptr]

        # -- rules -----------------------------------------------------------------------
        @precondition(lambda self: self.mr is not None and self.mr.device_accessible and len(self.streams) < max_streams)
        @rule()
        def create_stream(self):
            s = Stream.create(self.mr.device_id or 0, driver=self.driver)
            self.streams.append(s)
            note(f"create {s!r}")

        @precondition(lambda self: self.mr is not None and any(
            not s.is_default and all(b.stream is not s for b in self.model.values()) for s in self.streams))
        @rule(i=st.integers(0, 7))
        def destroy_stream(self, i):
            idle = [s for s in self.streams if not s.is_default and all(b.stream is not s for b in self.model.values())]
            s = idle[i % len(idle)]
            self.streams.remove(s)
            note(f"destroy {s!r} (its pending work still completes; the resource may hold its frees)")
            s.close()

        @precondition(lambda self: self.mr is not None)
        @rule(target=blocks, nbytes=SIZES, align=st.sampled_from([256, 1, 64, 512, 4096]), si=st.integers(0, 7),
              fill=st.booleans())
        def allocate(self, nbytes, align, si, fill):
            b = self._allocate(nbytes, min(align, self.mr.max_alignment), self._stream(si), fill)
            return multiple() if b is None else b

        @precondition(lambda self: self.mr is not None)
        @rule(target=blocks, sizes=st.lists(SIZES, min_size=2, max_size=6), si=st.integers(0, 7))
        def allocate_many(self, sizes, si):
            """Several filled blocks at once on one stream: reaches limits, growth, stealing and the
            out-of-memory paths in fewer steps."""
            got = [self._allocate(n, 256, self._stream(si), True) for n in sizes]
            return multiple(*[b for b in got if b is not None])

        @precondition(lambda self: self.mr is not None)
        @rule(target=blocks, si=st.integers(0, 7), ti=st.integers(0, 7), unit=st.sampled_from([2 << 20, 4 << 20, 1 << 16]))
        def fragment(self, si, ti, unit):
            """Fragmentation on purpose: two filled blocks on one stream, the first freed (its fill
            still queued), then a block twice as large on another stream. It cannot reuse the hole,
            so the resource grows, steals or (a VMM with a footprint limit) moves the hole's pages."""
            s, t = self._stream(si), self._stream(ti)
            a = self._allocate(unit, 256, s, True)
            c = self._allocate(unit, 256, s, True)
            if a is not None:
                self._verify(a)
                self._free(a, s)
            big = self._allocate(2 * unit, 256, t, True)
            return multiple(*[b for b in (c, big) if b is not None])

        @precondition(lambda self: self.mr is not None and self.limited)
        @rule(target=blocks, sizes=st.lists(st.integers(1, 1 << 17), min_size=2, max_size=4),
              si=st.integers(0, 7), extra=st.sampled_from([1, 2 << 20, (2 << 20) + 4096, 4 << 20]))
        def gather(self, sizes, si, extra):
            """Memory freed on several streams, then gathered: small filled blocks, each on its own
            stream and freed there (the free memory ends up split between those streams' lists), then
            one block on the first stream as large as all of them and ``extra`` more. A VMM with a
            footprint limit (the resources this rule runs on) must move or reuse those pages within its
            bound, ordered after every stream whose memory it takes; other resources meet cross-stream
            reuse in ``fragment`` and in their steals."""
            got = []
            for k, n in enumerate(sizes):
                b = self._allocate(n, 256, self._stream(si + k), True)
                if b is not None:
                    got.append(b)
            for b in got:
                self._verify(b)
                self._free(b, b.stream)
            big = self._allocate(sum(sizes) + extra, 256, self._stream(si), True)
            return multiple() if big is None else big

        @precondition(lambda self: self.mr is not None and self.mr.device_accessible)
        @rule(target=blocks, ti=st.integers(0, 7), nbytes=SIZES)
        def orphan(self, ti, nbytes):
            """A short-lived stream: allocates, fills, frees and is destroyed while its fill may still
            be queued; then another stream asks for the same size (the resource must order it after
            the dead stream's work without recording anything on its handle)."""
            s = Stream.create(self.mr.device_id or 0, driver=self.driver)
            note(f"create {s!r}")
            b = self._allocate(nbytes, 256, s, True)
            if b is not None:
                self._free(b, s)
            s.close()
            note(f"destroy {s!r}")
            got = self._allocate(nbytes, 256, self._stream(ti), True)
            return multiple() if got is None else got

        @rule(b=blocks)
        def fill(self, b):
            if b.ptr in self.model and self.model[b.ptr] is b:
                self._fill(b)
                note(f"fill {b!r} with {b.pattern}")

        @rule(b=blocks)
        def verify(self, b):
            if b.ptr in self.model and self.model[b.ptr] is b:
                self._verify(b)

        @rule(b=consumes(blocks), how=st.sampled_from(["own", "event", "after sync", "event, new stream"]),
              si=st.integers(0, 7))
        def free(self, b, how, si):
            if b.ptr not in self.model or self.model[b.ptr] is not b:
                return
            self._verify(b)
            s, t = b.stream, self._stream(si)
            if how == "event, new stream":  # a consumer stream that never allocated frees the block
                how = "event"
                if self.mr.device_accessible and len(self.streams) < max_streams + 2:
                    t = Stream.create(self.mr.device_id or 0, driver=self.driver)
                    self.streams.append(t)
                    note(f"create {t!r}")
            if how == "event" and self.mr.device_accessible and t != s:
                ev = Event.create(self.mr.device_id or 0, driver=self.driver)
                ev.record(s)
                t.wait(ev)
                ev.close()
                note(f"{t!r} waits for {s!r} (event)")
                s = t
            elif how == "after sync" and self.mr.device_accessible and t != s:
                s.synchronize()
                note(f"host synchronised {s!r}")
                s = t
            self._free(b, s)

        @precondition(lambda self: self.mr is not None and self.mr.device_accessible)
        @rule(si=st.integers(0, 7))
        def synchronize(self, si):
            s = self._stream(si)
            s.synchronize()
            note(f"synchronize {s!r}")

        if driven:
            @precondition(lambda self: self.mr is not None)
            @rule(choices=st.lists(st.integers(0, 15), min_size=1, max_size=12))
            def advance(self, choices):
                ran = self.driver.run_choices(choices)
                note(f"the device ran {ran} ops (choices {choices})")
        elif sim:
            @precondition(lambda self: self.mr is not None)
            @rule(steps=st.integers(1, 20))
            def advance(self, steps):
                ran = self.driver.run_random(max_steps=steps)
                note(f"scheduler ran {ran} ops")

        @precondition(lambda self: self.mr is not None and hasattr(self.mr, "release"))
        @rule()
        def release(self):
            note(f"release() gave back {self.mr.release()} bytes")

        @precondition(lambda self: self.mr is not None and hasattr(self.mr, "trim")
                      and getattr(self.mr, "trim", None) != getattr(self.mr, "release", None))
        @rule()
        def trim(self):
            note(f"trim() gave back {self.mr.trim()} bytes")

        if sim and faults:
            @precondition(lambda self: self.mr is not None)
            @rule(after=st.integers(0, 3), error=st.sampled_from(["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_UNKNOWN"]))
            def upstream_fails(self, after, error):
                self.driver.fail_allocation(after, error)
                note(f"the driver's allocation after the next {after} fails with {error}")

        if threads:
            @precondition(lambda self: self.mr is not None)
            @rule(order=st.lists(st.integers(0, 1), min_size=2, max_size=12), sizes=st.lists(SIZES, min_size=2, max_size=2),
                  si=st.integers(0, 7))
            def two_threads(self, order, sizes, si):
                """Two host threads, each allocating, filling and freeing on its own stream, one step
                at a time in the order ``order`` gives (deterministic, so it shrinks and replays)."""
                streams = [self._stream(si), self._stream(si + 1)]
                steps = [0, 0]
                held: list = [None, None]
                turn = threading.Condition()
                current = [None]
                errors: list = []

                def step(k):
                    n = sizes[k]
                    if steps[k] % 2 == 0:
                        held[k] = self._allocate(n, 256, streams[k], True)
                    elif held[k] is not None:
                        b, held[k] = held[k], None
                        self._verify(b)
                        self._free(b, b.stream)
                    steps[k] += 1

                def worker(k):
                    while True:
                        with turn:
                            turn.wait_for(lambda: current[0] in (k, "done"))
                            if current[0] == "done":
                                return
                            try:
                                step(k)
                            except BaseException as exc:  # reported on the machine's thread
                                errors.append(exc)
                            current[0] = None
                            turn.notify_all()

                ts = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
                for t in ts:
                    t.start()
                def run_turn(k):
                    with turn:
                        current[0] = k
                        turn.notify_all()
                        turn.wait_for(lambda: current[0] is None)

                self._thread_notes = []
                try:
                    for k in order:
                        run_turn(k)
                        if errors:
                            break
                    for k in (0, 1):  # every thread ends with its block freed
                        if held[k] is not None and not errors:
                            run_turn(k)
                finally:
                    with turn:
                        current[0] = "done"
                        turn.notify_all()
                    for t in ts:
                        t.join()
                notes, self._thread_notes = self._thread_notes, None
                note(f"two threads, turns {order}, on {streams}: " + "; ".join(notes))
                if errors:
                    raise errors[0]

        if sim:
            @precondition(lambda self: self.mr is not None and self.driver.device_count() > 1)
            @rule(d=st.integers(0, 3))
            def caller_device(self, d):
                """From now on the machine calls the resource with another device current (a program
                that works on two GPUs): ``DEFAULT_STREAM`` still means the resource's device's."""
                self.caller = d % self.driver.device_count()
                note(f"the caller's current device is now {self.caller}")

        @precondition(lambda self: self.mr is not None and self.mr.device_accessible)
        @rule(n=st.sampled_from([256, 4096, 1 << 20]), si=st.integers(0, 7))
        def torch_hooks_replaced(self, n, si):
            """PyTorch's allocator callbacks (``mrkit.torch.AllocatorCallbacks``, no PyTorch needed) serve
            the current resource; another resource is made current before the free: the block still
            goes home to the resource that allocated it."""
            dev, s = self.mr.device_id or 0, self._stream(si)
            cb = AllocatorCallbacks(None)
            with using(self.api, dev):
                ptr = cb.alloc(n, dev, s.handle)
            if ptr is None:
                self.refusals += 1
                note(f"torch hooks: alloc({n}) refused ({cb.last_error!r})")
                return
            self._counted_outside(n)
            with using(CudaMemoryResource(dev, driver=self.driver), dev):
                cb.free(ptr, n, dev, s.handle)
            note(f"torch hooks: alloc({n}) on {s!r} -> {ptr:#x}; another resource made current; freed")
            assert cb.last_error is None, f"the torch free of {ptr:#x} failed: {cb.last_error!r}"
            assert (cb.foreign_frees, cb.live_bytes) == (0, 0), "the torch hooks lost track of a block"

        @precondition(lambda self: self.mr is not None and self.mr.device_accessible)
        @rule(n=st.sampled_from([512, 4096, 1 << 20]), si=st.integers(0, 7), keep=st.booleans())
        def cupy_hooks_replaced(self, n, si, keep):
            """CuPy's allocator hooks (``mrkit.cupy.AllocatorHooks``, no CuPy needed) serve the current
            resource; another resource is made current while the block is live (CuPy's allocator then
            serves the device from the new one), and the block, freed through the hook it came with,
            still goes home. ``keep``: the new resource serves one more block first."""
            dev, s = self.mr.device_id or 0, self._stream(si)
            hooks = AllocatorHooks(None, lambda device_id: s)
            try:
                with using(self.api, dev):
                    ptr, free = hooks.malloc(n, dev)
            except (OutOfMemoryError, CUDAError) as exc:
                if isinstance(exc, CUDAError) and INJECTED not in str(exc):
                    raise
                self.refusals += 1
                note(f"cupy hooks: malloc({n}) refused ({exc!r})")
                return
            self._counted_outside(n)
            other = CudaMemoryResource(dev, driver=self.driver)
            with using(other, dev):
                assert hooks.resource_for(dev) is other, "CuPy's hooks still serve a replaced resource"
                try:
                    if keep:
                        try:
                            q, qfree = hooks.malloc(256, dev)
                        except (OutOfMemoryError, CUDAError) as exc:  # an injected failure is the driver's
                            if isinstance(exc, CUDAError) and INJECTED not in str(exc):
                                raise
                        else:
                            assert other.outstanding() == {q: 256}, "the new current resource did not serve the block"
                            qfree(q, dev)
                finally:
                    free(ptr, dev)
            note(f"cupy hooks: malloc({n}) on {s!r} -> {ptr:#x}; another resource made current; freed")
            assert not other.outstanding(), "a block went to the resource made current after it"

        if sim and faults:
            @precondition(lambda self: self.mr is not None and any(
                isinstance(r, VirtualMemoryResource) for r in walk_stack(self.mr)))
            @rule(target=blocks, si=st.integers(0, 7), ti=st.integers(0, 7))
            def out_of_memory_twice(self, si, ti):
                """A VMM runs out of device memory twice (injected): a large block mapped before the
                first time is freed on one stream, its check still queued, and another stream's request
                then needs pages; the mappings made large before the device filled up are released
                (unmapped: not stream ordered), after waiting for the stream that freed them."""
                s, t = self._stream(si), self._stream(ti)
                # the injected failures change the VMM's later layout (its runs shrink after one), so
                # a replay without them may run out where this run did not: not a finding
                self.refusals += 1
                big = self._allocate(96 << 20, 256, s, True)
                self.driver.fail_allocation(0, "CUDA_ERROR_OUT_OF_MEMORY", calls=("cuMemCreate",))
                small = self._allocate(4 << 20, 256, t, True)
                if big is not None:
                    self._verify(big)
                    self._free(big, s)
                self.driver.fail_allocation(0, "CUDA_ERROR_OUT_OF_MEMORY", calls=("cuMemCreate",))
                large = self._allocate(128 << 20, 256, t, False)
                return multiple(*[b for b in (small, large) if b is not None])

        @precondition(lambda self: self.mr is not None and self.stats is not None and len(self.frames) < 3)
        @rule()
        def push_counters(self):
            """A new counter frame on the statistics adaptor (RMM's ``push_statistics``): it returns the
            frame below as it was, and the new one counts from zero."""
            below = _counters(self.stats.push_counters())
            exp = self._expected_counters(self.frames[-1] if self.frames else None)
            assert below == exp, f"push_counters returned {below} for the frame below, the model {exp}"
            b, n = self._live_bytes(), len(self.model)
            self.frames.append([b, n, self.counted_bytes, self.counter, b, n])
            note(f"push a counter frame (depth {len(self.frames)})")

        @precondition(lambda self: self.mr is not None and self.stats is not None and self.frames)
        @rule()
        def pop_counters(self):
            """The top frame ends: it is returned as counted, and folded into the frame below (whose
            peak is then the highest it saw, the popped frame's included)."""
            top = _counters(self.stats.pop_counters())
            exp = self._expected_counters(self.frames.pop())
            assert top == exp, f"pop_counters returned {top}, the model {exp}"
            note(f"pop a counter frame (depth {len(self.frames)})")

        @precondition(lambda self: self.mr is not None)
        @rule(si=st.integers(0, 7))
        def allocate_zero(self, si):
            """A zero-byte request and its free: no adaptor counts either (RMM's and CCCL's rule)."""
            s = self._stream(si)
            ptr = self.api.allocate(0, s)
            self.api.deallocate(ptr, 0, s)
            note(f"allocate(0) on {s!r} -> {ptr:#x}, freed")

        @precondition(lambda self: self.mr is not None)
        @rule(calls=st.lists(st.lists(st.sampled_from([256, 4096, 65536, 1 << 20]), min_size=1, max_size=4),
                             min_size=1, max_size=3))
        def profiled(self, calls):
            """Calls under ``mrkit.statistics.profiler`` with the stack as the current resource: the
            record counts the calls and keeps the highest peak of any one call."""
            dev = self.mr.device_id or 0
            with using(self.api, dev):
                for sizes in calls:
                    with profiler(self.profile_name, device=dev):
                        mr, got = get_current_resource(dev), []
                        for n in sizes:
                            try:
                                got.append((mr.allocate(n, DEFAULT_STREAM), n))
                            except (OutOfMemoryError, CUDAError):
                                self.refusals += 1
                                break
                            self.counter += 1
                            self.counted_bytes += n
                        self._peaked(sum(n for _, n in got), len(got))
                        for p, n in got:
                            mr.deallocate(p, n, DEFAULT_STREAM)
                    self.profile_calls += 1
                    self.profile_peak = max(self.profile_peak, sum(n for _, n in got))
            rec = profiler_records()[self.profile_name]
            note(f"profiled calls of {calls}: record peak {rec.peak_bytes}, {rec.calls} calls")
            assert rec.calls == self.profile_calls, f"the profiler counted {rec.calls} calls, {self.profile_calls} were made"
            assert rec.peak_bytes == self.profile_peak, (
                f"the profiler's peak is {rec.peak_bytes}; the highest peak of one call was {self.profile_peak}")

        @precondition(lambda self: self.mr is not None and any(isinstance(r, LimitingAdaptor) for r in walk_stack(self.mr)))
        @rule(target=blocks, si=st.integers(0, 7))
        def to_the_limit(self, si):
            """Exactly the room a limiting adaptor has left is granted (unless its upstream refuses);
            one byte more is refused by the adaptor, naming its limit."""
            lim = next(r for r in walk_stack(self.mr) if isinstance(r, LimitingAdaptor))
            room, s = lim.limit - lim.used_bytes, self._stream(si)
            if room <= 0:
                return multiple()
            try:
                ptr = self.api.allocate(room, s)
            except OutOfMemoryError as exc:
                assert exc.resource is not lim, f"{lim!r} refused {room} bytes, exactly the room it has: {exc}"
                self.refusals += 1
                return multiple()
            except CUDAError as exc:
                if INJECTED not in str(exc):
                    raise
                self.refusals += 1
                return multiple()
            self.counter += 1
            self.counted_bytes += room
            b = _Block(ptr, room, 256, s, self.counter % 255 + 1)
            self.model[ptr] = b
            self._peaked()
            note(f"allocate({room}) (the limit's room) on {s!r} -> {ptr:#x}")
            try:
                extra = self.api.allocate(1, s)
            except OutOfMemoryError as exc:
                assert exc.resource is lim, f"one byte past the limit was refused by {exc.resource!r}, not {lim!r}"
            except CUDAError as exc:
                if INJECTED not in str(exc):
                    raise
            else:
                self.api.deallocate(extra, 1, s)
                raise AssertionError(f"{lim!r} granted one byte past its limit ({lim.used_bytes} used)")
            return b

        # -- invariants -------------------------------------------------------------------
        @invariant()
        def no_overlap_and_aligned(self):
            if self.mr is None:
                return
            spans = sorted((b.ptr, b.nbytes) for b in self.model.values())
            for (p1, n1), (p2, _) in zip(spans, spans[1:]):
                assert p1 + n1 <= p2, f"live blocks overlap: {p1:#x}+{n1} and {p2:#x}"
            for b in self.model.values():
                assert b.ptr % b.alignment == 0

        @invariant()
        def nothing_corrupted(self):
            if self.mr is not None:
                assert not self.corrupt, self.corrupt[0]

        @invariant()
        def bytes_agree(self):
            if self.mr is None:
                return
            want = self._live_bytes()
            for r in walk_stack(self.mr):
                if isinstance(r, StatisticsAdaptor):
                    frame = self.frames[-1] if r is self.stats and self.frames else None
                    got = _counters(r.statistics)
                    exp = self._expected_counters(frame)
                    assert got == exp, (
                        f"statistics {'of the top frame ' if frame else ''}count (current, peak, total) "
                        f"bytes then allocations {got}, the model {exp}")
                if isinstance(r, LimitingAdaptor):
                    assert r.used_bytes == want, f"limiting adaptor counts {r.used_bytes}, the model {want}"
                    assert r.used_bytes <= r.limit, f"limiting adaptor is past its limit: {r.used_bytes} > {r.limit}"
                if isinstance(r, VirtualMemoryResource) and r in self.limited:
                    assert r.physical_bytes <= self.footprint_bound, (
                        f"{r!r} holds {r.physical_bytes} physical bytes, past its footprint_limit bound "
                        f"{self.footprint_bound} (limit x the live high-water mark + one page per live allocation)")
                if isinstance(r, TrackingAdaptor):
                    got = r.outstanding()
                    assert got == {p: b.nbytes for p, b in self.model.items()}, (
                        f"tracking adaptor has {len(got)} allocations ({r.live_bytes} bytes) outstanding, the "
                        f"model {len(self.model)} ({want} bytes)")
            live = getattr(self.mr, "live_bytes", None)
            if live is not None:
                assert live == want, f"{self.mr!r}.live_bytes is {live}, the model says {want}"

        @invariant()
        def log_replays_to_the_live_set(self):
            """The log so far, read back, leaves exactly the live blocks live (nothing lost, after
            every step)."""
            if self.mr is None or not log_roundtrip:
                return
            self.api.flush()
            text = self.api._file.getvalue()
            new = text[self._log_pos:]
            live = self._log_live
            if new:  # the lines written since the last step, read with the log's header
                header = text[:text.index("\n") + 1]
                for e in read_log(new if self._log_pos == 0 else header + new):
                    if e.action == "allocate":
                        live[e.pointer] = e.size
                    elif e.action == "free":
                        live.pop(e.pointer, None)
                self._log_pos = len(text)
            want = {p: b.nbytes for p, b in self.model.items()}
            assert live == want, (f"the log leaves {len(live)} blocks live, the run {len(want)}: "
                                  f"{sorted(set(live.items()) ^ set(want.items()))[:3]}")

        def teardown(self):
            if self.mr is None:
                return
            try:
                for b in list(self.model.values()):
                    self._verify(b)
                    self._free(b, b.stream)
                for s in self.streams:
                    s.synchronize()
                if sim:
                    self.driver.run_all()
                    assert not self.corrupt, self.corrupt[0]
                live = getattr(self.mr, "live_bytes", None)
                assert live in (None, 0), f"{live} bytes still live after every block was freed"
                rel = getattr(self.mr, "release", None) or getattr(self.mr, "trim", None)
                if rel is not None:
                    rel()
                if self.baseline is not None:
                    self.driver.ctx_synchronize(self.mr.device_id or 0)
                    free = self.driver.mem_get_info(self.mr.device_id or 0)[0]
                    assert free >= self.baseline, (
                        f"memory was not returned: {self.baseline - free} bytes fewer free than at the start")
                if log_roundtrip and sim:
                    self._replay_log()
            finally:
                for s in self.streams:
                    s.close()
                _close_stack(self.mr)
                if self._previous_driver is not None:
                    set_backend(self._previous_driver)
                else:
                    reset_backend()

        def _replay_log(self):
            """The run's log, read back and replayed against a fresh resource: same allocations and
            frees, the same peak, everything freed."""
            self.api.flush()
            events = read_log(self.api._file.getvalue())
            allocs = sum(e.action == "allocate" and e.size > 0 for e in events)  # zero-size ones aside
            assert allocs == self.counter, f"the log has {allocs} allocations, the run made {self.counter}"
            assert sum(e.action == "free" and e.size > 0 for e in events) == self.counter, "the log lost frees"
            fresh_driver = SimDriver(policy="eager")
            previous = set_backend(fresh_driver)
            try:
                fresh = factory(fresh_driver)
                r = replay(events, fresh, driver=fresh_driver)
                if not self.refusals:
                    assert r.failures == 0, f"replaying the log failed {r.failures} allocations the run served"
                    assert r.peak_live_bytes == self.peak, (
                        f"the replay peaked at {r.peak_live_bytes} live bytes, the run at {self.peak}")
                live = getattr(fresh, "live_bytes", None)
                assert live in (None, 0), f"the replay left {live} bytes live"
            finally:
                set_backend(previous) if previous is not None else reset_backend()

    Machine.__name__ = Machine.__qualname__ = name
    return Machine
