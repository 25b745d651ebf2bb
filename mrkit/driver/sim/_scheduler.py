"""The scheduler: which stream work runs, and when (public stepping and the internals)."""
from __future__ import annotations

import random

from ._model import _Device, _Op, _Stream, _err, _merge

__all__ = ["SchedulerMixin"]


class SchedulerMixin:
    """Part of :class:`~mrkit.driver.sim.SimDriver`: the scheduler: which stream work runs, and when (public stepping and the internals)."""

    # ================================================================ scheduler (public)
    def run_all(self) -> None:
        """Run every pending op on every stream (in the current policy's order)."""
        with self._lock:
            while True:
                ready = self._runnable()
                if not ready:
                    break
                self._execute(self.rng.choice(ready) if self.policy == "random" else ready[0])

    def step(self, stream: int | None = None) -> bool:
        """Run one runnable op: the head of ``stream`` (a handle) if given, else the first runnable
        one. Returns False when nothing could run (empty, or blocked on another stream)."""
        with self._lock:
            if stream is None:
                ready = self._runnable()
                if not ready:
                    return False
                self._execute(ready[0])
                return True
            s = self._stream(stream, "step")
            if not s.queue or not all(d.done for d in s.queue[0].deps):
                return False
            self._execute(s.queue[0])
            return True

    def run_random(self, seed: int | None = None, max_steps: int | None = None) -> int:
        """Run runnable ops in a seeded random order that respects stream order and waits, up to
        ``max_steps`` ops (all of them by default). Returns the number of ops run."""
        rng = self.rng if seed is None else random.Random(seed)
        n = 0
        with self._lock:
            while max_steps is None or n < max_steps:
                ready = self._runnable()
                if not ready:
                    break
                self._execute(rng.choice(ready))
                n += 1
        return n

    def run_choices(self, choices) -> int:
        """Run one runnable op per choice: the ``c % len(runnable)``-th of the runnable ops (in the
        order streams were created) for each ``c`` in ``choices``; stops early when nothing can run.
        Every scheduling decision then comes from the caller's data, so a property-based test that
        draws ``choices`` explores interleavings and shrinks a failing one to a short list."""
        n = 0
        with self._lock:
            for c in choices:
                ready = self._runnable()
                if not ready:
                    break
                self._execute(ready[c % len(ready)])
                n += 1
        return n

    def pending_ops(self) -> int:
        """Ops enqueued and not yet run, over all streams."""
        return sum(len(s.queue) for s in self._all_streams)

    # ================================================================ internals: scheduling
    def _runnable(self) -> list[_Op]:
        out = []
        for s in self._all_streams:
            if s.queue:
                head = s.queue[0]
                if all(d.done for d in head.deps):
                    out.append(head)
        return out

    def _execute(self, op: _Op) -> None:
        s = op.stream
        assert s.queue and s.queue[0] is op
        if op.fn is not None:
            op.fn()
        s.queue.popleft()
        op.done = True
        if s.destroyed and not s.queue and s in self._all_streams:
            self._retire(s)

    def _retire(self, s: _Stream) -> None:
        """A destroyed stream whose work has all run: forget it, but keep its clock so that a later
        device or context synchronise still counts as having observed its work."""
        self._all_streams.remove(s)
        _merge(self._devices[s.dev].retired, s.clock)

    def _complete(self, op: _Op | None) -> None:
        while op is not None and not op.done:
            head = op.stream.queue[0]
            for d in head.deps:
                if not d.done:
                    self._complete(d)
            self._execute(head)

    def _observe(self, clock: dict) -> None:
        _merge(self._host, clock)
        self._release_pools()

    def _cur_dev(self) -> int:
        return getattr(self._tls, "dev", 0)

    def _stream(self, handle: int, call: str) -> _Stream:
        if handle in (0, 1):
            return self._device(self._cur_dev(), call).legacy
        if handle == 2:
            d = self._device(self._cur_dev(), call)
            if d.per_thread is None:
                uid = next(self._uids)
                d.per_thread = _Stream(uid, 2, d.index, blocking=True,
                                       label=f"per-thread default stream of device {d.index} (id {uid})")
                self._all_streams.append(d.per_thread)
            return d.per_thread
        s = self._streams.get(handle)
        if s is None:
            raise _err("CUDA_ERROR_INVALID_HANDLE", call, f"{handle:#x} is not a live stream")
        return s

    def _device(self, dev, call: str) -> _Device:
        if not isinstance(dev, int) or isinstance(dev, bool) or not 0 <= dev < len(self._devices):
            raise _err("CUDA_ERROR_INVALID_DEVICE", call, f"device {dev!r} (this simulator has "
                       f"{len(self._devices)})")
        return self._devices[dev]

    def _next(self, s: _Stream, extra_deps=(), extra_clock=None):
        """The clock, seq and dependencies the next op on ``s`` would get (no state changes)."""
        clock = dict(s.clock)
        _merge(clock, self._host)
        deps = [s.last] if s.last is not None and not s.last.done else []
        d = self._devices[s.dev]
        if s.legacy:
            for o in self._all_streams:
                if o.blocking and not o.legacy and o.dev == s.dev:
                    _merge(clock, o.clock)
                    if o.last is not None and not o.last.done:
                        deps.append(o.last)
        elif s.blocking:
            _merge(clock, d.legacy.clock)
            if d.legacy.last is not None and not d.legacy.last.done:
                deps.append(d.legacy.last)
        if extra_clock:
            _merge(clock, extra_clock)
        deps.extend(x for x in extra_deps if x is not None and not x.done)
        seq = s.seq + 1
        clock[s.uid] = seq
        return clock, seq, deps

    def _enqueue(self, s: _Stream, kind: str, fn, desc: str, prepared) -> _Op:
        clock, seq, deps = prepared
        op = _Op(s, seq, kind, fn, deps, desc, clock)
        s.seq = seq
        s.clock = clock
        s.last = op
        s.queue.append(op)
        if self.policy == "eager":
            self._complete(op)
        elif self.policy == "random":
            self.run_random(max_steps=self.rng.randint(0, 3))
        return op
