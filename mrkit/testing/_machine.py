"""A Hypothesis state machine for allocate/free ordering over any resource."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, precondition, rule

from .._errors import OutOfMemoryError
from .._resource import MemoryResource
from .._stream import DEFAULT_STREAM, Event, Stream
from ..adaptors import LimitingAdaptor, StatisticsAdaptor
from ..driver import Driver, SimDriver, reset_backend, get_driver, set_backend
from ._conformance import Harness, read_back, walk_stack, write_pattern

__all__ = ["make_state_machine", "default_backend"]

SIZES = st.one_of(
    st.integers(1, 512),
    st.sampled_from([256, 1000, 4096, 65536, 1 << 20]),
    st.integers(513, 3 << 20),
)


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


def make_state_machine(factory: Callable[[Driver], MemoryResource], *, backend: str | None = None,
                       max_streams: int = 3, sim_factory: Callable[[int], SimDriver] | None = None,
                       name: str = "ResourceMachine") -> type:
    """Build a ``RuleBasedStateMachine`` class testing ``factory(driver)``'s resource.

    Rules allocate (sizes, alignments, streams), use blocks (a fill on their stream), free them on
    their stream or on another stream made to wait, synchronise, create and destroy streams, trim,
    and on the simulator advance a seeded random interleaving. Invariants: no two live blocks
    overlap, every block is aligned, and live bytes agree with a plain model, with every
    ``StatisticsAdaptor``/``LimitingAdaptor`` in the stack, and with the resource's own
    ``live_bytes``. Each block's contents are checked before it is freed. On the simulator any
    stream-order violation fails the run. Teardown frees everything and proves it was returned.

    ``backend`` is ``"sim"`` or ``"cuda"`` (default: :func:`default_backend`); ``sim_factory(seed)``
    builds the simulated driver (default: one device, random scheduling policy).
    """
    backend = backend or default_backend()
    if backend not in ("sim", "cuda"):
        raise ValueError(f"backend must be 'sim' or 'cuda', got {backend!r}")
    sim = backend == "sim"
    make_sim = sim_factory or (lambda seed: SimDriver(policy="random", seed=seed))

    class Machine(RuleBasedStateMachine):
        blocks = Bundle("blocks")

        def __init__(self) -> None:
            super().__init__()
            self.mr = None
            self._previous_driver = None

        @initialize(seed=st.integers(0, 2**31 - 1))
        def setup(self, seed):
            self.driver = make_sim(seed) if sim else get_driver()
            # the machine's driver is the process's driver until teardown, so DEFAULT_STREAM and
            # resources built with default arguments use it too
            self._previous_driver = set_backend(self.driver)
            self.mr = factory(self.driver)
            self.h = Harness(self.mr, self.driver)
            self.model: dict[int, _Block] = {}
            self.streams: list[Stream] = [DEFAULT_STREAM] if self.mr.device_accessible else [DEFAULT_STREAM]
            self.counter = 0
            dev = self.mr.device_id or 0
            self.baseline = self.driver.mem_get_info(dev)[0] if sim and self.driver.device_count() else None
            note(f"resource: {self.mr!r}, backend {backend}, seed {seed}")

        # -- helpers ---------------------------------------------------------------------
        def _stream(self, i: int) -> Stream:
            return self.streams[i % len(self.streams)]

        def _live_bytes(self) -> int:
            return sum(b.nbytes for b in self.model.values())

        # -- rules -----------------------------------------------------------------------
        @precondition(lambda self: self.mr is not None and self.mr.device_accessible and len(self.streams) < max_streams)
        @rule()
        def create_stream(self):
            s = Stream.create(self.mr.device_id or 0, driver=self.driver)
            self.streams.append(s)
            note(f"create {s!r}")

        @precondition(lambda self: self.mr is not None and any(
            not s.is_default and all(b.stream is not s for b in self.model.values()) for s in self.streams))
        @rule()
        def destroy_stream(self):
            s = next(s for s in self.streams if not s.is_default and all(b.stream is not s for b in self.model.values()))
            self.streams.remove(s)
            note(f"destroy {s!r} (its pending work still completes)")
            s.close()

        @precondition(lambda self: self.mr is not None)
        @rule(target=blocks, nbytes=SIZES, align=st.sampled_from([1, 64, 256, 512, 4096]), si=st.integers(0, 7))
        def allocate(self, nbytes, align, si):
            align = min(align, self.mr.max_alignment)
            s = self._stream(si)
            before = self._live_bytes()
            try:
                ptr = self.mr.allocate(nbytes, s, align)
            except OutOfMemoryError as exc:
                note(f"allocate({nbytes}) on {s!r}: out of memory ({exc})")
                assert self._live_bytes() == before
                return multiple()
            assert ptr % align == 0, f"{ptr:#x} is not {align}-aligned"
            assert ptr not in self.model, f"{ptr:#x} handed out twice"
            self.counter += 1
            b = _Block(ptr, nbytes, align, s, self.counter % 255 + 1)
            self.model[ptr] = b
            note(f"allocate({nbytes}, align={align}) on {s!r} -> {ptr:#x}")
            return b

        @rule(b=blocks)
        def use(self, b):
            if b.ptr not in self.model:
                return
            write_pattern(self.h, b.ptr, b.nbytes, b.pattern, b.stream)
            b.used = True
            note(f"fill {b!r} with {b.pattern}")

        @rule(b=consumes(blocks), other=st.booleans(), verify=st.booleans(), si=st.integers(0, 7))
        def free(self, b, other, verify, si):
            if b.ptr not in self.model:
                return
            if b.used and verify:
                got = read_back(self.h, b.ptr, b.nbytes, b.stream)
                assert got == bytes([b.pattern]) * b.nbytes, (
                    f"{b!r} was corrupted: expected {b.pattern}, found {sorted(set(got))[:4]}")
            s = b.stream
            t = self._stream(si)
            if other and self.mr.device_accessible and t != s:
                ev = Event.create(self.mr.device_id or 0, driver=self.driver)
                ev.record(s)
                t.wait(ev)
                ev.close()
                s = t
            note(f"free {b!r} on {s!r}")
            self.mr.deallocate(b.ptr, b.nbytes, s, b.alignment)
            del self.model[b.ptr]

        @precondition(lambda self: self.mr is not None and self.mr.device_accessible)
        @rule(si=st.integers(0, 7))
        def synchronize(self, si):
            s = self._stream(si)
            s.synchronize()
            note(f"synchronize {s!r}")

        @precondition(lambda self: self.mr is not None and sim)
        @rule(steps=st.integers(1, 20))
        def advance(self, steps):
            ran = self.driver.run_random(max_steps=steps)
            note(f"scheduler ran {ran} ops")

        @precondition(lambda self: self.mr is not None and hasattr(self.mr, "release"))
        @rule()
        def release(self):
            note(f"release() gave back {self.mr.release()} bytes")

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
        def bytes_agree(self):
            if self.mr is None:
                return
            want = self._live_bytes()
            for r in walk_stack(self.mr):
                if isinstance(r, StatisticsAdaptor):
                    assert r.statistics.current_bytes == want, (
                        f"statistics say {r.statistics.current_bytes} live bytes, the model {want}")
                    assert r.statistics.current_count == len(self.model)
                if isinstance(r, LimitingAdaptor):
                    assert r.used_bytes == want, f"limiting adaptor counts {r.used_bytes}, the model {want}"
            live = getattr(self.mr, "live_bytes", None)
            if live is not None:
                assert live == want, f"{self.mr!r}.live_bytes is {live}, the model says {want}"

        def teardown(self):
            if self.mr is None:
                return
            try:
                for b in list(self.model.values()):
                    self.mr.deallocate(b.ptr, b.nbytes, b.stream, b.alignment)
                self.model.clear()
                for s in self.streams:
                    s.synchronize()
                if sim:
                    self.driver.run_all()
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
            finally:
                for s in self.streams:
                    s.close()
                if self._previous_driver is not None:
                    set_backend(self._previous_driver)
                else:
                    reset_backend()

    Machine.__name__ = Machine.__qualname__ = name
    return Machine
