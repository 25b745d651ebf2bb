"""A deterministic simulated CUDA device: the second backend of the :class:`~mrkit.driver.Driver`
interface, for CI machines without a GPU and for users testing their own allocation code.

What it models (after the CUDA Driver API reference's memory management, stream ordered allocator,
virtual memory management and unified addressing sections):

* **Devices** with configurable count, memory size, VMM granularity and capabilities
  (:class:`SimDeviceSpec`). Pointers live in one unified address space; bytes are stored sparsely
  so large simulated devices cost nothing until written.
* **Streams are FIFO queues** of operations that run only when the scheduler advances them:
  ``run_all()``, ``step(stream)``, ``run_random(seed)``, or a ``policy`` of ``"manual"`` (default),
  ``"eager"`` (run at once, like a synchronous GPU) or ``"random"`` (a seeded random interleaving
  advanced after every call). Synchronize and query calls advance exactly what they must. Events,
  stream waits, the legacy default stream's implicit synchronisation with blocking streams,
  non-blocking streams, and destruction of streams with pending work (which still completes).
* **A shadow checker.** Every memory operation (memset, memcpy, ``touch``, stream-ordered alloc and
  free, host reads and writes of host-accessible memory) is checked against the access history of the
  bytes it touches using vector clocks: an access conflicts with an earlier one unless the earlier one
  *happens before* it through stream order, events, the default stream, or a synchronisation the host
  observed. Conflicts raise :class:`~mrkit.StreamOrderViolation` naming the kind
  (``use-after-free``, ``use-before-allocation``, ``race``, ``unmapped``, ``not-accessible``,
  ``out-of-bounds``, ``unallocated``) and the history of the ops involved. Because the check is by
  happens-before, not by the interleaving that happened to run, an ordering bug is found on the first
  run; the scheduler's interleavings additionally expose bugs that depend on execution (memory
  unmapped or released while work is pending).
* **Driver calls and their documented errors**: cuMemAlloc/Free, pinned host memory, managed memory
  with advice and prefetch, memory pools (reuse policies, release threshold, trim, attributes,
  access, IPC export/import), VMM (reserve, create, map, set access, unmap, release, address free).

Everything is single-process; the simulator is not thread-safe beyond a global lock around each call.
"""
from __future__ import annotations

import bisect
import itertools
import random
import struct
import threading
from collections import deque
from dataclasses import dataclass, field

from .._errors import CUDAError, OutOfMemoryError, StreamOrderViolation
from ._base import ACCESS_FLAGS, DEVICE_CAPABILITIES, MANAGED_ADVICE, POOL_ATTRIBUTES, VMM_HANDLE_TYPES, Driver

__all__ = ["SimDriver", "SimDeviceSpec"]

_ERRORS = {
    "CUDA_ERROR_INVALID_VALUE": (1, "invalid argument"),
    "CUDA_ERROR_OUT_OF_MEMORY": (2, "out of memory"),
    "CUDA_ERROR_INVALID_DEVICE": (101, "invalid device ordinal"),
    "CUDA_ERROR_INVALID_HANDLE": (400, "invalid resource handle"),
    "CUDA_ERROR_NOT_READY": (600, "device not ready"),
    "CUDA_ERROR_NOT_SUPPORTED": (801, "operation not supported"),
}

HOST = -1  # the host's entry in vector clocks
_PAGE = 1 << 16  # sparse backing chunk
_ALIGN = 512  # address alignment of driver allocations


def _err(name: str, call: str, detail: str = "") -> CUDAError:
    code, expl = _ERRORS[name]
    return CUDAError(name, code, call, f"{expl}: {detail}" if detail else expl)


def _oom(call: str, nbytes: int, detail: str) -> OutOfMemoryError:
    return OutOfMemoryError(f"{call}: the CUDA driver is out of memory for a request of {nbytes} bytes "
                            f"(CUDA_ERROR_OUT_OF_MEMORY: {detail})", nbytes, call)


@dataclass(frozen=True)
class SimDeviceSpec:
    """One simulated device. All sizes in bytes."""

    name: str = "mrkit simulated GPU"
    total_memory: int = 1 << 30
    granularity: int = 2 << 20
    recommended_granularity: int = 2 << 20
    memory_pools: bool = True
    vmm: bool = True
    managed: bool = True
    concurrent_managed_access: bool = True
    compute_capability: tuple = (9, 0)
    multiprocessors: int = 132
    vmm_handle_types: tuple = ("none", "posix_fd")  # shareable handle types cuMemCreate accepts


# -- sparse byte storage --------------------------------------------------------------------
class _Backing:
    __slots__ = ("size", "chunks")

    def __init__(self, size: int) -> None:
        self.size = size
        self.chunks: dict[int, bytearray] = {}

    def read(self, off: int, n: int) -> bytes:
        out = bytearray(n)
        pos = 0
        while pos < n:
            ci, co = divmod(off + pos, _PAGE)
            take = min(_PAGE - co, n - pos)
            ch = self.chunks.get(ci)
            if ch is not None:
                out[pos:pos + take] = ch[co:co + take]
            pos += take
        return bytes(out)

    def write(self, off: int, data: bytes) -> None:
        n = len(data)
        pos = 0
        while pos < n:
            ci, co = divmod(off + pos, _PAGE)
            take = min(_PAGE - co, n - pos)
            ch = self.chunks.get(ci)
            if ch is None:
                ch = self.chunks[ci] = bytearray(_PAGE)
            ch[co:co + take] = data[pos:pos + take]
            pos += take

    def fill(self, off: int, n: int, value: int) -> None:
        pos = 0
        while pos < n:
            ci, co = divmod(off + pos, _PAGE)
            take = min(_PAGE - co, n - pos)
            ch = self.chunks.get(ci)
            if ch is None:
                if value == 0:
                    pos += take
                    continue
                ch = self.chunks[ci] = bytearray(_PAGE)
            ch[co:co + take] = bytes([value]) * take
            pos += take


# -- scheduling objects --------------------------------------------------------------------
class _Op:
    __slots__ = ("stream", "seq", "kind", "fn", "deps", "desc", "done", "clock")

    def __init__(self, stream, seq, kind, fn, deps, desc, clock):
        self.stream, self.seq, self.kind, self.fn = stream, seq, kind, fn
        self.deps, self.desc, self.done, self.clock = deps, desc, False, clock

    def __repr__(self) -> str:
        return f"#{self.seq} {self.desc} on {self.stream.label}"


class _Stream:
    __slots__ = ("uid", "handle", "dev", "blocking", "legacy", "queue", "last", "clock", "seq",
                 "destroyed", "label")

    def __init__(self, uid, handle, dev, blocking, legacy=False, label=""):
        self.uid, self.handle, self.dev = uid, handle, dev
        self.blocking, self.legacy = blocking, legacy
        self.queue: deque[_Op] = deque()
        self.last: _Op | None = None
        self.clock: dict[int, int] = {}
        self.seq = 0
        self.destroyed = False
        self.label = label or f"stream {handle:#x} (id {uid})"


class _Event:
    __slots__ = ("handle", "dev", "op", "clock", "destroyed")

    def __init__(self, handle, dev):
        self.handle, self.dev = handle, dev
        self.op: _Op | None = None
        self.clock: dict[int, int] = {}
        self.destroyed = False


class _Rec:
    """One entry of an access history: [lo, hi) accessed as kind by op (uid, seq)."""

    __slots__ = ("lo", "hi", "kind", "uid", "seq", "desc")

    def __init__(self, lo, hi, kind, uid, seq, desc):
        self.lo, self.hi, self.kind, self.uid, self.seq, self.desc = lo, hi, kind, uid, seq, desc

    def __repr__(self) -> str:
        return f"{self.kind} [{self.lo:#x}, {self.hi:#x}) by {self.desc}"


class _Region:
    """A range of the address space: a driver allocation, a pool block or a VMM reservation."""

    __slots__ = ("base", "size", "kind", "dev", "backing", "records", "live", "pool", "advice",
                 "host_accessible", "mappings", "attach", "in_use")

    def __init__(self, base, size, kind, dev, host_accessible=False):
        self.base, self.size, self.kind, self.dev = base, size, kind, dev
        self.backing = _Backing(size) if kind != "reservation" else None
        self.records: list[_Rec] = []
        self.live = True
        self.pool = None
        self.advice: dict = {}
        self.host_accessible = host_accessible
        self.mappings: dict[int, "_Mapping"] = {}  # page index -> mapping (reservations)
        self.attach = "global"
        self.in_use = 0  # bytes of a pool block in use by the application

    @property
    def end(self) -> int:
        return self.base + self.size


class _Handle:
    __slots__ = ("handle", "dev", "size", "backing", "released", "mappings", "handle_type")

    def __init__(self, handle, dev, size, handle_type="none"):
        self.handle, self.dev, self.size, self.handle_type = handle, dev, size, handle_type
        self.backing = _Backing(size)
        self.released = False
        self.mappings = 0


class _Mapping:
    __slots__ = ("ptr", "size", "handle", "offset", "access")

    def __init__(self, ptr, size, handle, offset):
        self.ptr, self.size, self.handle, self.offset = ptr, size, handle, offset
        self.access: dict[int, str] = {}


@dataclass
class _Pool:
    handle: int
    dev: int
    max_size: int = 0
    ipc: str = "none"
    default: bool = False
    imported_from: int = 0
    attrs: dict = field(default_factory=lambda: {
        "reuse_follow_event_dependencies": 1, "reuse_allow_opportunistic": 1,
        "reuse_allow_internal_dependencies": 1, "release_threshold": 0})
    reserved: int = 0
    reserved_high: int = 0
    used: int = 0
    used_high: int = 0
    free: list = field(default_factory=list)  # [region, stream uid, free op]
    access: dict = field(default_factory=dict)
    destroyed: bool = False


class _Device:
    def __init__(self, index: int, spec: SimDeviceSpec) -> None:
        self.index, self.spec = index, spec
        self.used = 0
        self.legacy: _Stream | None = None
        self.per_thread: _Stream | None = None
        self.default_pool: _Pool | None = None
        self.current_pool: _Pool | None = None
        self.retired: dict[int, int] = {}  # merged clocks of destroyed, drained streams


class _AddressSpace:
    """First-fit allocator of virtual addresses; freed ranges are reused, like the real driver."""

    def __init__(self, start: int, end: int) -> None:
        self.free = [(start, end)]

    def alloc(self, size: int, align: int) -> int | None:
        for i, (lo, hi) in enumerate(self.free):
            a = -(-lo // align) * align
            if a + size <= hi:
                pieces = [(lo, a)] if a > lo else []
                if a + size < hi:
                    pieces.append((a + size, hi))
                self.free[i:i + 1] = pieces
                return a
        return None

    def release(self, base: int, size: int) -> None:
        i = bisect.bisect(self.free, (base, base + size))
        lo, hi = base, base + size
        if i < len(self.free) and self.free[i][0] == hi:
            hi = self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][1] == lo:
            lo = self.free.pop(i - 1)[0]
            i -= 1
        self.free.insert(i, (lo, hi))


def _merge(into: dict, other: dict) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class SimDriver(Driver):
    """The simulated backend.

    Parameters
    ----------
    devices: an int (that many default devices) or a sequence of :class:`SimDeviceSpec`.
    policy: ``"manual"`` (work runs only when the scheduler is advanced or the host synchronises),
        ``"eager"`` (each op runs as soon as it is enqueued and runnable) or ``"random"`` (after
        every call, a seeded random number of random runnable ops run).
    seed: the seed of the ``"random"`` policy and of ``run_random()`` without a seed.
    driver_version: what :meth:`driver_version` reports.
    """

    name = "sim"

    def __init__(self, devices=1, policy: str = "manual", seed: int = 0,
                 driver_version: int = 13000) -> None:
        if isinstance(devices, int):
            if devices < 0:
                raise ValueError(f"devices must be >= 0, got {devices}")
            specs = [SimDeviceSpec() for _ in range(devices)]
        else:
            specs = list(devices)
            if not all(isinstance(s, SimDeviceSpec) for s in specs):
                raise TypeError("devices must be an int or a sequence of SimDeviceSpec")
        if policy not in ("manual", "eager", "random"):
            raise ValueError(f"policy must be 'manual', 'eager' or 'random', got {policy!r}")
        self._devices = [_Device(i, s) for i, s in enumerate(specs)]
        self.policy = policy
        self.rng = random.Random(seed)
        self._version = driver_version
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._uids = itertools.count(1)
        self._handles = itertools.count(0x1000, 0x10)
        self._free_stream_handles: list[int] = []
        self._streams: dict[int, _Stream] = {}
        self._all_streams: list[_Stream] = []
        self._events: dict[int, _Event] = {}
        self._pools: dict[int, _Pool] = {}
        self._vmm: dict[int, _Handle] = {}
        self._space = _AddressSpace(0x7F00_0000_0000, 0x7FFF_0000_0000)
        self._bases: list[int] = []
        self._regions: dict[int, _Region] = {}
        self._graveyard: dict[int, tuple[int, str]] = {}  # freed base -> (size, by whom)
        self._host: dict[int, int] = {HOST: 0}
        self._ipc_exports: dict[int, int] = {}
        self._imported_ptrs: set[int] = set()
        self.checks = 0  # number of accesses checked (for tests of the checker itself)
        for d in self._devices:
            uid = next(self._uids)
            d.legacy = _Stream(uid, 0, d.index, blocking=True, legacy=True,
                               label=f"legacy default stream of device {d.index} (id {uid})")
            self._all_streams.append(d.legacy)

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

    def pending_ops(self) -> int:
        """Ops enqueued and not yet run, over all streams."""
        return sum(len(s.queue) for s in self._all_streams)

    # ================================================================ host access (public)
    def read(self, ptr: int, nbytes: int) -> bytes:
        """Read host-accessible memory (pinned, managed) from the host, checked like any access."""
        with self._lock:
            segs = self._check_access(ptr, nbytes, "read", None, "host read", host_only=True)
            return b"".join(b.read(o, n) for b, o, n in segs)

    def write(self, ptr: int, data: bytes) -> None:
        """Write host-accessible memory (pinned, managed) from the host, checked like any access."""
        with self._lock:
            data = bytes(data)
            segs = self._check_access(ptr, len(data), "write", None, "host write", host_only=True)
            pos = 0
            for b, o, n in segs:
                b.write(o, data[pos:pos + n])
                pos += n

    def peek(self, ptr: int, nbytes: int) -> bytes:
        """Read any simulated memory now, without checks or ordering (a debugging aid)."""
        with self._lock:
            return b"".join(b.read(o, n) for b, o, n in self._segments(ptr, nbytes, "peek"))

    def regions(self) -> list[tuple[int, int, str]]:
        """Live driver allocations as ``(base, size, kind)``, sorted by address."""
        return [(b, self._regions[b].size, self._regions[b].kind) for b in self._bases
                if self._regions[b].live]

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

    # ================================================================ internals: memory map
    def _add_region(self, r: _Region) -> None:
        bisect.insort(self._bases, r.base)
        self._regions[r.base] = r
        for b in list(self._graveyard):
            if b < r.end and r.base < b + self._graveyard[b][0]:
                del self._graveyard[b]

    def _drop_region(self, r: _Region, by: str) -> None:
        i = bisect.bisect_left(self._bases, r.base)
        del self._bases[i]
        del self._regions[r.base]
        r.live = False
        self._space.release(r.base, r.size)
        self._graveyard[r.base] = (r.size, by)

    def _find(self, ptr: int) -> _Region | None:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i >= 0:
            r = self._regions[self._bases[i]]
            if ptr < r.end:
                return r
        return None

    def _new_address(self, size: int, call: str, align: int = _ALIGN) -> int:
        a = self._space.alloc(max(size, 1), align)
        if a is None:
            raise _oom(call, size, "simulated address space exhausted")
        return a

    def _violation(self, kind: str, what: str, recs=(), op_desc="") -> StreamOrderViolation:
        lines = [f"{kind}: {what}"]
        if op_desc:
            lines.append(f"  offending op: {op_desc}")
        for r in recs:
            lines.append(f"  conflicts with: {r!r}")
        return StreamOrderViolation("\n".join(lines), kind, tuple(recs))

    def _segments(self, ptr: int, n: int, desc: str, dev: int | None = None, write=True):
        """(backing, offset, length) pieces for [ptr, ptr+n), or raise a violation."""
        r = self._find(ptr)
        if r is None or not r.live:
            for b, (size, by) in self._graveyard.items():
                if b <= ptr < b + size:
                    raise self._violation("use-after-free", f"{desc} at {ptr:#x}: memory was freed by {by}")
            raise self._violation("unallocated", f"{desc} at {ptr:#x}: no allocation there")
        if ptr + n > r.end:
            raise self._violation("out-of-bounds", f"{desc} of {n} bytes at {ptr:#x} runs past the end "
                                  f"of the {r.size}-byte allocation at {r.base:#x}")
        if r.kind != "reservation":
            if dev is not None and r.pool is not None and dev != r.dev:
                flags = r.pool.access.get(dev, "none")
                if flags == "none" or (write and flags == "read"):
                    raise self._violation("not-accessible", f"{desc}: device {dev} has {flags!r} access "
                                          f"to pool memory of device {r.dev}")
            return [(r.backing, ptr - r.base, n)]
        gran = self._devices[r.dev].spec.granularity
        segs, pos = [], ptr
        while pos < ptr + n:
            m = r.mappings.get((pos - r.base) // gran)
            if m is None:
                raise self._violation("unmapped", f"{desc} at {pos:#x}: address is reserved but not mapped")
            if dev is not None:
                flags = m.access.get(dev, "none")
                if flags == "none" or (write and flags == "read"):
                    raise self._violation("not-accessible", f"{desc} at {pos:#x}: device {dev} has "
                                          f"{flags!r} access to this mapping (cuMemSetAccess not called?)")
            take = min(m.ptr + m.size, ptr + n) - pos
            segs.append((m.handle.backing, m.offset + pos - m.ptr, take))
            pos += take
        return segs

    def _check_access(self, ptr, n, kind, prepared, desc, stream=None, host_only=False, record=True):
        """Check one access against the history; on success record it (unless ``record`` is false)
        and return its segments. Nothing is recorded when the check fails."""
        self.checks += 1
        if n <= 0:
            return []
        if host_only:
            r = self._find(ptr)
            if r is not None and not r.host_accessible:
                raise ValueError(f"ptr {ptr:#x} is device memory; only host-accessible memory "
                                 "(pinned, managed) can be read or written from the host")
            if r is not None and r.kind == "managed" and not self._devices[r.dev].spec.concurrent_managed_access:
                if any(s.queue for s in self._all_streams if s.dev == r.dev):
                    raise self._violation("race", f"{desc} at {ptr:#x}: managed memory touched by the host "
                                          "while the device (without concurrent managed access) has work pending")
        dev = stream.dev if stream is not None else None
        segs = self._segments(ptr, n, desc, dev=dev, write=kind != "read")
        r = self._find(ptr)
        if prepared is None:  # a host access: ordered after what the host has observed
            clock, uid, seq = self._host, HOST, self._host[HOST] + 1
        else:
            clock, seq, _ = prepared
            uid = stream.uid
        lo, hi = ptr, ptr + n
        bad = []
        for rec in r.records:
            if rec.lo < hi and lo < rec.hi:
                if rec.kind == "free" and kind not in ("alloc", "free"):
                    bad.append(rec)  # freed memory: a use-after-free however it is ordered
                elif clock.get(rec.uid, 0) < rec.seq and not (rec.kind == "read" and kind == "read"):
                    bad.append(rec)
        if bad:
            first = bad[0]
            vk = {"alloc": "use-before-allocation", "free": "use-after-free"}.get(first.kind, "race")
            if kind == "free":
                vk = "race"
                what = f"free of [{lo:#x}, {hi:#x}) is not ordered after earlier accesses"
            elif kind == "alloc":
                what = f"allocation of [{lo:#x}, {hi:#x}) reuses memory still in use"
            else:
                what = (f"{kind} of [{lo:#x}, {hi:#x}) by {desc} is not ordered after the conflicting "
                        f"{first.kind}")
            raise self._violation(vk, what, bad)
        if not record:
            return segs
        if prepared is None:
            self._host[HOST] = seq
        rec = _Rec(lo, hi, kind, uid, seq, desc)
        if kind != "read":
            # A write-like access ordered after everything it covers supersedes those records.
            r.records = [x for x in r.records if not (lo <= x.lo and x.hi <= hi)]
        elif len(r.records) > 64:
            r.records = [x for x in r.records if self._host.get(x.uid, 0) < x.seq]
        r.records.append(rec)
        return segs

    # ================================================================ versions and devices
    def driver_version(self) -> int:
        return self._version

    def device_count(self) -> int:
        return len(self._devices)

    def device_name(self, dev: int) -> str:
        return self._device(dev, "cuDeviceGetName").spec.name

    def device_total_mem(self, dev: int) -> int:
        return self._device(dev, "cuDeviceTotalMem").spec.total_memory

    def device_capability(self, dev: int, name: str) -> int:
        spec = self._device(dev, "cuDeviceGetAttribute").spec
        if name not in DEVICE_CAPABILITIES:
            raise ValueError(f"unsupported capability: {name!r}")
        return int({
            "memory_pools_supported": spec.memory_pools,
            "virtual_memory_management_supported": spec.vmm,
            "managed_memory": spec.managed,
            "concurrent_managed_access": spec.concurrent_managed_access,
            "unified_addressing": True,
            "pageable_memory_access": False,
            "compute_capability_major": spec.compute_capability[0],
            "compute_capability_minor": spec.compute_capability[1],
            "multiprocessor_count": spec.multiprocessors,
        }[name])

    def mem_get_info(self, dev: int) -> tuple[int, int]:
        d = self._device(dev, "cuMemGetInfo")
        return d.spec.total_memory - d.used, d.spec.total_memory

    def ensure_context(self, dev: int) -> None:
        self._device(dev, "cuCtxSetCurrent")
        self._tls.dev = dev

    def ctx_synchronize(self, dev: int) -> None:
        with self._lock:
            self._device(dev, "cuCtxSynchronize")
            self._sync_device(dev)

    def _sync_device(self, dev: int) -> None:
        for s in list(self._all_streams):
            if s.dev == dev:
                self._complete(s.last)
                self._observe(s.clock)
        self._observe(self._devices[dev].retired)

    def can_access_peer(self, dev: int, peer: int) -> bool:
        self._device(dev, "cuDeviceCanAccessPeer")
        self._device(peer, "cuDeviceCanAccessPeer")
        return dev != peer

    # ================================================================ streams and events
    def stream_create(self, dev: int, nonblocking: bool = True, priority: int = 0) -> int:
        with self._lock:
            self._device(dev, "cuStreamCreateWithPriority")
            handle = self._free_stream_handles.pop() if self._free_stream_handles else next(self._handles)
            s = _Stream(next(self._uids), handle, dev, blocking=not nonblocking)
            self._streams[handle] = s
            self._all_streams.append(s)
            return handle

    def stream_destroy(self, stream: int) -> None:
        with self._lock:
            if stream in (0, 1, 2):
                raise _err("CUDA_ERROR_INVALID_HANDLE", "cuStreamDestroy", "the default stream cannot be destroyed")
            s = self._stream(stream, "cuStreamDestroy")
            s.destroyed = True
            del self._streams[stream]
            self._free_stream_handles.append(stream)  # handles are reused, as on real drivers
            if not s.queue:
                self._retire(s)

    def stream_synchronize(self, stream: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamSynchronize")
            self._complete(s.last)
            self._observe(s.clock)

    def stream_query(self, stream: int) -> bool:
        with self._lock:
            s = self._stream(stream, "cuStreamQuery")
            if s.queue:
                return False
            self._observe(s.clock)
            return True

    def stream_get_id(self, stream: int) -> int:
        return self._stream(stream, "cuStreamGetId").uid

    def stream_get_device(self, stream: int) -> int:
        return self._stream(stream, "cuStreamGetDevice").dev

    def stream_wait_event(self, stream: int, event: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWaitEvent")
            e = self._event(event, "cuStreamWaitEvent")
            if e.op is None:
                return  # waiting on a never-recorded event is a no-op
            prepared = self._next(s, extra_deps=(e.op,), extra_clock=e.clock)
            self._enqueue(s, "wait", None, f"wait for event {event:#x}", prepared)

    def _event(self, handle: int, call: str) -> _Event:
        e = self._events.get(handle)
        if e is None:
            raise _err("CUDA_ERROR_INVALID_HANDLE", call, f"{handle:#x} is not a live event")
        return e

    def event_create(self, dev: int) -> int:
        with self._lock:
            self._device(dev, "cuEventCreate")
            h = next(self._handles)
            self._events[h] = _Event(h, dev)
            return h

    def event_destroy(self, event: int) -> None:
        with self._lock:
            self._event(event, "cuEventDestroy").destroyed = True
            del self._events[event]

    def event_record(self, event: int, stream: int) -> None:
        with self._lock:
            e = self._event(event, "cuEventRecord")
            s = self._stream(stream, "cuEventRecord")
            op = self._enqueue(s, "record", None, f"record event {event:#x}", self._next(s))
            e.op, e.clock = op, dict(op.clock)

    def event_query(self, event: int) -> bool:
        with self._lock:
            e = self._event(event, "cuEventQuery")
            if e.op is not None and not e.op.done:
                return False
            self._observe(e.clock)
            return True

    def event_synchronize(self, event: int) -> None:
        with self._lock:
            e = self._event(event, "cuEventSynchronize")
            self._complete(e.op)
            self._observe(e.clock)

    # ================================================================ plain allocation
    def _reserve_device_bytes(self, d: _Device, n: int, call: str) -> None:
        if d.used + n > d.spec.total_memory:
            raise _oom(call, n, f"device {d.index} has {d.spec.total_memory - d.used} of "
                       f"{d.spec.total_memory} bytes free")
        d.used += n

    def mem_alloc(self, dev: int, nbytes: int) -> int:
        with self._lock:
            d = self._device(dev, "cuMemAlloc")
            if nbytes <= 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemAlloc", f"bytesize {nbytes} must be > 0")
            self._reserve_device_bytes(d, nbytes, "cuMemAlloc")
            try:
                r = _Region(self._new_address(nbytes, "cuMemAlloc"), nbytes, "device", dev)
            except BaseException:
                d.used -= nbytes
                raise
            self._add_region(r)
            return r.base

    def _sync_all(self) -> None:
        for d in self._devices:
            self._sync_device(d.index)

    def mem_free(self, ptr: int) -> None:
        with self._lock:
            r = self._regions.get(ptr)
            if ptr in self._imported_ptrs:
                self._imported_ptrs.discard(ptr)
                return
            if r is None or r.kind not in ("device", "managed"):
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemFree",
                           f"{ptr:#x} was not returned by cuMemAlloc/cuMemAllocManaged or was freed already")
            self._sync_all()  # cuMemFree synchronises with outstanding work
            self._devices[r.dev].used -= r.size if r.kind == "device" else 0
            self._drop_region(r, "cuMemFree")

    def mem_host_alloc(self, nbytes, portable=True, devicemap=True, writecombined=False) -> int:
        with self._lock:
            if nbytes <= 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemHostAlloc", f"bytesize {nbytes} must be > 0")
            r = _Region(self._new_address(nbytes, "cuMemHostAlloc"), nbytes, "pinned", 0, host_accessible=True)
            self._add_region(r)
            return r.base

    def mem_free_host(self, ptr: int) -> None:
        with self._lock:
            r = self._regions.get(ptr)
            if r is None or r.kind != "pinned":
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemFreeHost",
                           f"{ptr:#x} was not returned by cuMemHostAlloc or was freed already")
            self._sync_all()
            self._drop_region(r, "cuMemFreeHost")

    def mem_alloc_managed(self, dev: int, nbytes: int, attach: str = "global") -> int:
        with self._lock:
            d = self._device(dev, "cuMemAllocManaged")
            if attach not in ("global", "host"):
                raise ValueError(f"unsupported attach: {attach!r} (expected 'global' or 'host')")
            if not d.spec.managed:
                raise _err("CUDA_ERROR_NOT_SUPPORTED", "cuMemAllocManaged", f"device {dev} has no managed memory")
            if nbytes <= 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemAllocManaged", f"bytesize {nbytes} must be > 0")
            r = _Region(self._new_address(nbytes, "cuMemAllocManaged"), nbytes, "managed", dev, host_accessible=True)
            r.attach = attach
            self._add_region(r)
            return r.base

    def _location(self, location, call):
        if location == "host":
            return "host"
        self._device(location, call)
        return location

    def _managed_range(self, ptr, nbytes, call) -> _Region:
        r = self._find(ptr)
        if r is None or r.kind != "managed" or nbytes <= 0 or ptr + nbytes > r.end:
            raise _err("CUDA_ERROR_INVALID_VALUE", call, f"[{ptr:#x}, +{nbytes}) is not inside a managed allocation")
        return r

    def mem_advise(self, ptr: int, nbytes: int, advice: str, location) -> None:
        with self._lock:
            if advice not in MANAGED_ADVICE:
                raise ValueError(f"unsupported advice: {advice!r} (expected one of {sorted(MANAGED_ADVICE)})")
            loc = self._location(location, "cuMemAdvise")
            r = self._managed_range(ptr, nbytes, "cuMemAdvise")
            key = advice.split("_", 1)[1]
            if advice.startswith("set_"):
                r.advice[key] = loc
            else:
                r.advice.pop(key, None)

    def managed_advice(self, ptr: int) -> dict:
        """The advice currently set on the managed allocation holding ``ptr`` (simulator only)."""
        return dict(self._managed_range(ptr, 1, "managed_advice").advice)

    def mem_prefetch_async(self, ptr: int, nbytes: int, location, stream: int) -> None:
        with self._lock:
            loc = self._location(location, "cuMemPrefetchAsync")
            self._managed_range(ptr, nbytes, "cuMemPrefetchAsync")
            s = self._stream(stream, "cuMemPrefetchAsync")
            self._enqueue(s, "prefetch", None, f"prefetch [{ptr:#x}, +{nbytes}) to {loc}", self._next(s))

    def pointer_info(self, ptr: int) -> dict:
        r = self._find(ptr)
        if r is None or (r.kind == "reservation" and not r.mappings):
            raise _err("CUDA_ERROR_INVALID_VALUE", "cuPointerGetAttribute", f"{ptr:#x} is not a known pointer")
        return {"memory_type": "host" if r.kind == "pinned" else "device",
                "device_ordinal": r.dev, "is_managed": r.kind == "managed",
                "range_start": r.base, "range_size": r.size, "kind": r.kind}

    # ================================================================ data movement
    def _op_access(self, stream, accesses, kind, fn_factory, desc):
        """Check accesses (ptr, n, 'read'|'write') for an op on ``stream``, then enqueue it."""
        with self._lock:
            s = self._stream(stream, desc.split()[0])
            prepared = self._next(s)
            label = f"{desc} (op #{prepared[1]} on {s.label})"
            # check everything before recording anything, so a violation leaves no trace
            for record in (False, True):
                for ptr, n, k in accesses:
                    self._check_access(ptr, n, k, prepared, label, stream=s, record=record)
            return self._enqueue(s, kind, fn_factory(s), desc, prepared)

    def _exec_segments(self, ptr, n, desc, dev, write):
        try:
            return self._segments(ptr, n, desc + " (at execution)", dev=dev, write=write)
        except StreamOrderViolation as exc:
            raise StreamOrderViolation(str(exc).replace(": ", ": when the op ran, ", 1), exc.kind, exc.ops) from None

    def memset_async(self, ptr, value, nbytes, stream) -> None:
        if not 0 <= value <= 255:
            raise ValueError(f"value must be a byte (0..255), got {value}")

        def factory(s):
            def run():
                for b, o, n in self._exec_segments(ptr, nbytes, "memset", s.dev, True):
                    b.fill(o, n, value)
            return run
        self._op_access(stream, [(ptr, nbytes, "write")], "memset", factory,
                        f"cuMemsetD8Async [{ptr:#x}, +{nbytes}) = {value}")

    def memcpy_async(self, dst, src, nbytes, stream) -> None:
        def factory(s):
            def run():
                data = b"".join(b.read(o, n) for b, o, n in self._exec_segments(src, nbytes, "memcpy", s.dev, False))
                pos = 0
                for b, o, n in self._exec_segments(dst, nbytes, "memcpy", s.dev, True):
                    b.write(o, data[pos:pos + n])
                    pos += n
            return run
        self._op_access(stream, [(src, nbytes, "read"), (dst, nbytes, "write")], "memcpy", factory,
                        f"cuMemcpyAsync {src:#x} -> {dst:#x} ({nbytes} bytes)")

    def touch(self, ptr, nbytes, stream, write=True) -> None:
        def factory(s):
            def run():
                segs = self._exec_segments(ptr, nbytes, "touch", s.dev, write)
                if write:
                    for b, o, n in segs:
                        b.fill(o, n, 0xA5)
            return run
        self._op_access(stream, [(ptr, nbytes, "write" if write else "read")], "touch", factory,
                        f"kernel {'writing' if write else 'reading'} [{ptr:#x}, +{nbytes})")

    def copy_to_host(self, ptr, nbytes, stream) -> bytes:
        out = []

        def factory(s):
            def run():
                out.append(b"".join(b.read(o, n) for b, o, n in self._exec_segments(ptr, nbytes, "copy", s.dev, False)))
            return run
        self._op_access(stream, [(ptr, nbytes, "read")], "memcpy", factory,
                        f"cuMemcpyDtoHAsync [{ptr:#x}, +{nbytes})")
        self.stream_synchronize(stream)
        return out[0]

    def copy_from_host(self, ptr, data, stream) -> None:
        data = bytes(data)

        def factory(s):
            def run():
                pos = 0
                for b, o, n in self._exec_segments(ptr, len(data), "copy", s.dev, True):
                    b.write(o, data[pos:pos + n])
                    pos += n
            return run
        self._op_access(stream, [(ptr, len(data), "write")], "memcpy", factory,
                        f"cuMemcpyHtoDAsync [{ptr:#x}, +{len(data)})")
        self.stream_synchronize(stream)

    # ================================================================ memory pools
    def _pool(self, handle: int, call: str) -> _Pool:
        p = self._pools.get(handle)
        if p is None or p.destroyed:
            raise _err("CUDA_ERROR_INVALID_VALUE", call, f"{handle:#x} is not a live memory pool")
        return p

    def _pools_supported(self, dev: int, call: str) -> _Device:
        d = self._device(dev, call)
        if not d.spec.memory_pools:
            raise _err("CUDA_ERROR_NOT_SUPPORTED", call, f"device {dev} does not support memory pools")
        return d

    def device_get_default_mem_pool(self, dev: int) -> int:
        with self._lock:
            d = self._pools_supported(dev, "cuDeviceGetDefaultMemPool")
            if d.default_pool is None:
                h = next(self._handles)
                d.default_pool = self._pools[h] = _Pool(h, dev, default=True)
                d.default_pool.access[dev] = "readwrite"
            return d.default_pool.handle

    def device_get_mem_pool(self, dev: int) -> int:
        with self._lock:
            d = self._pools_supported(dev, "cuDeviceGetMemPool")
            if d.current_pool is None or d.current_pool.destroyed:
                return self.device_get_default_mem_pool(dev)
            return d.current_pool.handle

    def mem_pool_create(self, dev: int, max_size: int = 0, ipc_handle_type: str = "none") -> int:
        with self._lock:
            self._pools_supported(dev, "cuMemPoolCreate")
            if ipc_handle_type not in ("none", "posix_fd"):
                raise ValueError(f"unsupported ipc_handle_type: {ipc_handle_type!r} (expected 'none' or 'posix_fd')")
            if max_size < 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolCreate", f"maxSize {max_size} < 0")
            h = next(self._handles)
            self._pools[h] = p = _Pool(h, dev, max_size=max_size, ipc=ipc_handle_type)
            p.access[dev] = "readwrite"
            return h

    def mem_pool_destroy(self, pool: int) -> None:
        with self._lock:
            p = self._pool(pool, "cuMemPoolDestroy")
            if p.default:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolDestroy", "a device's default memory pool cannot be destroyed")
            p.destroyed = True  # outstanding blocks are released as they are freed
            for r, _, op in list(p.free):
                self._complete(op)
            self._trim(p, 0)
            d = self._devices[p.dev]
            if d.current_pool is p:
                d.current_pool = None

    def mem_pool_get_attribute(self, pool: int, name: str) -> int:
        with self._lock:
            p = self._pool(pool, "cuMemPoolGetAttribute")
            if name not in POOL_ATTRIBUTES:
                raise ValueError(f"unsupported pool attribute: {name!r}")
            return {"reserved_mem_current": p.reserved, "reserved_mem_high": p.reserved_high,
                    "used_mem_current": p.used, "used_mem_high": p.used_high}.get(name, p.attrs.get(name))

    def mem_pool_set_attribute(self, pool: int, name: str, value: int) -> None:
        with self._lock:
            p = self._pool(pool, "cuMemPoolSetAttribute")
            if name not in POOL_ATTRIBUTES:
                raise ValueError(f"unsupported pool attribute: {name!r}")
            if name in ("reserved_mem_current", "used_mem_current"):
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolSetAttribute", f"{name} is read-only")
            if name in ("reserved_mem_high", "used_mem_high"):
                if value != 0:
                    raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolSetAttribute",
                               f"{name} can only be reset (set to 0), got {value}")
                if name == "reserved_mem_high":
                    p.reserved_high = p.reserved
                else:
                    p.used_high = p.used
                return
            if value < 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolSetAttribute", f"{name} = {value}")
            p.attrs[name] = int(value)

    def _release_block(self, p: _Pool, r: _Region) -> None:
        p.reserved -= r.size
        self._devices[p.dev].used -= r.size
        self._drop_region(r, f"the release of memory pool {p.handle:#x}'s unused memory")

    def _trim(self, p: _Pool, keep: int) -> None:
        # only blocks whose free has completed can go back (TrimTo's documented limit)
        for entry in sorted([e for e in p.free if e[2].done], key=lambda e: -e[0].size):
            if p.reserved <= keep:
                break
            p.free.remove(entry)
            self._release_block(p, entry[0])

    def _release_pools(self) -> None:
        for p in self._pools.values():
            if p.free and p.reserved > p.attrs["release_threshold"]:
                self._trim(p, p.attrs["release_threshold"])

    def mem_pool_trim_to(self, pool: int, min_bytes_to_keep: int) -> None:
        with self._lock:
            p = self._pool(pool, "cuMemPoolTrimTo")
            if min_bytes_to_keep < 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolTrimTo", f"minBytesToKeep {min_bytes_to_keep}")
            self._trim(p, min_bytes_to_keep)

    def mem_pool_set_access(self, pool: int, dev: int, flags: str) -> None:
        with self._lock:
            p = self._pool(pool, "cuMemPoolSetAccess")
            self._device(dev, "cuMemPoolSetAccess")
            if flags not in ACCESS_FLAGS:
                raise ValueError(f"unsupported flags: {flags!r} (expected one of {list(ACCESS_FLAGS)})")
            if dev == p.dev and flags != "readwrite":
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolSetAccess",
                           "the pool's own device always has read-write access")
            p.access[dev] = flags

    def mem_pool_get_access(self, pool: int, dev: int) -> str:
        with self._lock:
            p = self._pool(pool, "cuMemPoolGetAccess")
            self._device(dev, "cuMemPoolGetAccess")
            return p.access.get(dev, "none")

    def mem_alloc_from_pool_async(self, nbytes: int, pool: int, stream: int) -> int:
        with self._lock:
            call = "cuMemAllocFromPoolAsync"
            p = self._pool(pool, call)
            s = self._stream(stream, call)
            if nbytes <= 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", call, f"bytesize {nbytes} must be > 0")
            if p.imported_from:
                raise _err("CUDA_ERROR_NOT_SUPPORTED", call, "imported memory pools do not support new allocations")
            need = -(-nbytes // _ALIGN) * _ALIGN
            prepared = self._next(s)
            clock = prepared[0]
            chosen, extra = None, ()
            best = None
            for entry in p.free:
                r, uid, op = entry
                if r.size < need or (best is not None and r.size >= best[0].size):
                    continue
                if uid == s.uid or (p.attrs["reuse_follow_event_dependencies"] and clock.get(uid, 0) >= op.seq):
                    best, extra = entry, ()
                elif p.attrs["reuse_allow_opportunistic"] and op.done:
                    best, extra = entry, ("clock",)
                elif p.attrs["reuse_allow_internal_dependencies"]:
                    best, extra = entry, ("dep",)
            if best is not None:
                r, uid, op = best
                if extra:  # the driver orders the allocation after the free it reuses
                    prepared = self._next(s, extra_deps=(op,) if extra == ("dep",) else (), extra_clock=op.clock)
                chosen = r
            else:
                if p.max_size and p.reserved + need > p.max_size:
                    self._trim(p, 0)
                    if p.reserved + need > p.max_size:
                        raise _oom(call, nbytes, f"pool {pool:#x} would exceed its maxSize of {p.max_size} "
                                   f"bytes ({p.reserved} reserved)")
                d = self._devices[p.dev]
                if d.used + need > d.spec.total_memory:
                    self._trim(p, 0)
                self._reserve_device_bytes(d, need, call)
                try:
                    chosen = _Region(self._new_address(need, call), need, "pool", p.dev)
                except BaseException:
                    d.used -= need
                    raise
                chosen.pool = p
                self._add_region(chosen)
                p.reserved += need
                p.reserved_high = max(p.reserved_high, p.reserved)
            self._check_access(chosen.base, chosen.size, "alloc", prepared,
                               f"cuMemAllocFromPoolAsync {chosen.base:#x} on {s.label}", stream=s)
            if best is not None:
                p.free.remove(best)
            self._enqueue(s, "alloc", None, f"alloc [{chosen.base:#x}, +{chosen.size}) from pool {pool:#x}", prepared)
            chosen.in_use = need
            p.used += need
            p.used_high = max(p.used_high, p.used)
            chosen.live = True
            return chosen.base

    def mem_free_async(self, ptr: int, stream: int) -> None:
        with self._lock:
            call = "cuMemFreeAsync"
            s = self._stream(stream, call)
            if ptr in self._imported_ptrs:
                self._imported_ptrs.discard(ptr)
                return
            r = self._regions.get(ptr)
            if r is None or r.kind != "pool" or r.pool is None or any(e[0] is r for e in r.pool.free):
                raise _err("CUDA_ERROR_INVALID_VALUE", call,
                           f"{ptr:#x} is not a live stream-ordered allocation (foreign pointer or double free)")
            p = r.pool
            prepared = self._next(s)
            self._check_access(ptr, r.size, "free", prepared, f"cuMemFreeAsync {ptr:#x} on {s.label}", stream=s)
            op = self._enqueue(s, "free", None, f"free [{ptr:#x}, +{r.size})", prepared)
            p.used -= r.in_use
            p.free.append([r, s.uid, op])
            if p.destroyed:
                self._complete(op)
                self._trim(p, 0)

    def mem_pool_export_to_shareable_handle(self, pool: int) -> int:
        with self._lock:
            p = self._pool(pool, "cuMemPoolExportToShareableHandle")
            if p.ipc == "none":
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolExportToShareableHandle",
                           "the pool was created without an IPC handle type")
            token = 3 + len(self._ipc_exports)  # stands for a file descriptor
            self._ipc_exports[token] = pool
            return token

    def mem_pool_import_from_shareable_handle(self, handle: int) -> int:
        with self._lock:
            origin = self._ipc_exports.get(handle)
            if origin is None:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolImportFromShareableHandle",
                           f"{handle} is not an exported pool handle")
            h = next(self._handles)
            src = self._pools[origin]
            self._pools[h] = _Pool(h, src.dev, ipc=src.ipc, imported_from=origin)
            return h

    def mem_pool_export_pointer(self, ptr: int) -> bytes:
        with self._lock:
            r = self._regions.get(ptr)
            if r is None or r.kind != "pool" or r.pool.ipc == "none":
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolExportPointer",
                           f"{ptr:#x} is not an allocation of an IPC-capable pool")
            return struct.pack("<QQ", ptr, r.pool.handle).ljust(64, b"\0")

    def mem_pool_import_pointer(self, pool: int, data: bytes) -> int:
        with self._lock:
            p = self._pool(pool, "cuMemPoolImportPointer")
            if len(data) != 64:
                raise ValueError(f"data must be the 64 bytes of an exported pointer, got {len(data)}")
            ptr, origin = struct.unpack_from("<QQ", data)
            r = self._regions.get(ptr)
            if p.imported_from != origin or r is None or r.pool is None or r.pool.handle != origin:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemPoolImportPointer",
                           "the export data does not name a live allocation of this imported pool")
            self._imported_ptrs.add(ptr)
            return ptr

    # ================================================================ virtual memory management
    def _vmm_device(self, dev: int, call: str) -> _Device:
        d = self._device(dev, call)
        if not d.spec.vmm:
            raise _err("CUDA_ERROR_NOT_SUPPORTED", call, f"device {dev} does not support virtual memory management")
        return d

    def _check_handle_type(self, d: _Device, handle_type: str, call: str) -> None:
        if handle_type not in VMM_HANDLE_TYPES:
            raise ValueError(f"handle_type must be one of {list(VMM_HANDLE_TYPES)}, got {handle_type!r}")
        if handle_type not in d.spec.vmm_handle_types:
            raise _err("CUDA_ERROR_NOT_SUPPORTED", call,
                       f"device {d.index} cannot create allocations exportable as {handle_type!r}")

    def mem_get_allocation_granularity(self, dev: int, recommended: bool = False, handle_type: str = "none") -> int:
        d = self._vmm_device(dev, "cuMemGetAllocationGranularity")
        self._check_handle_type(d, handle_type, "cuMemGetAllocationGranularity")
        return d.spec.recommended_granularity if recommended else d.spec.granularity

    def mem_create(self, dev: int, nbytes: int, handle_type: str = "none") -> int:
        with self._lock:
            d = self._vmm_device(dev, "cuMemCreate")
            self._check_handle_type(d, handle_type, "cuMemCreate")
            g = d.spec.granularity
            if nbytes <= 0 or nbytes % g:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemCreate",
                           f"size {nbytes} is not a positive multiple of the granularity {g}")
            self._reserve_device_bytes(d, nbytes, "cuMemCreate")
            h = next(self._handles)
            self._vmm[h] = _Handle(h, dev, nbytes, handle_type)
            return h

    def _vmm_free_if_unused(self, h: _Handle) -> None:
        if h.released and h.mappings == 0:
            self._devices[h.dev].used -= h.size
            del self._vmm[h.handle]

    def mem_release(self, handle: int) -> None:
        with self._lock:
            h = self._vmm.get(handle)
            if h is None or h.released:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemRelease", f"{handle:#x} is not a live allocation handle")
            h.released = True
            self._vmm_free_if_unused(h)

    def mem_address_reserve(self, nbytes: int, alignment: int = 0) -> int:
        with self._lock:
            g = min(d.spec.granularity for d in self._devices) if self._devices else _PAGE
            if nbytes <= 0 or nbytes % g:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemAddressReserve",
                           f"size {nbytes} is not a positive multiple of the granularity {g}")
            if alignment < 0 or (alignment & (alignment - 1)):
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemAddressReserve",
                           f"alignment {alignment} is not zero or a power of two")
            base = self._new_address(nbytes, "cuMemAddressReserve", max(alignment, g))
            r = _Region(base, nbytes, "reservation", 0)
            self._add_region(r)
            return base

    def mem_address_free(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            r = self._regions.get(ptr)
            if r is None or r.kind != "reservation" or r.size != nbytes:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemAddressFree",
                           f"({ptr:#x}, {nbytes}) does not match a reservation's start and size")
            if r.mappings:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemAddressFree", "the reservation still has mappings")
            self._drop_region(r, "cuMemAddressFree")

    def _reservation(self, ptr, nbytes, call) -> _Region:
        r = self._find(ptr)
        if r is None or r.kind != "reservation" or ptr + nbytes > r.end:
            raise _err("CUDA_ERROR_INVALID_VALUE", call, f"[{ptr:#x}, +{nbytes}) is not inside an address reservation")
        return r

    def mem_map(self, ptr: int, nbytes: int, offset: int, handle: int) -> None:
        with self._lock:
            h = self._vmm.get(handle)
            if h is None or h.released:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemMap", f"{handle:#x} is not a live allocation handle")
            g = self._devices[h.dev].spec.granularity
            if nbytes <= 0 or ptr % g or nbytes % g or offset % g:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemMap",
                           f"ptr, size and offset must be multiples of the granularity {g}")
            if offset + nbytes > h.size:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemMap",
                           f"offset {offset} + size {nbytes} exceeds the allocation's {h.size} bytes")
            r = self._reservation(ptr, nbytes, "cuMemMap")
            first = (ptr - r.base) // g
            pages = range(first, first + nbytes // g)
            if any(i in r.mappings for i in pages):
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemMap", "the range is already mapped")
            r.dev = h.dev
            m = _Mapping(ptr, nbytes, h, offset)
            for i in pages:
                r.mappings[i] = m
            h.mappings += 1
            # a fresh mapping has fresh contents as far as the checker is concerned
            r.records = [x for x in r.records if not (ptr <= x.lo and x.hi <= ptr + nbytes)]

    def mem_unmap(self, ptr: int, nbytes: int) -> None:
        with self._lock:
            r = self._reservation(ptr, nbytes, "cuMemUnmap")
            g = self._devices[r.dev].spec.granularity
            m = r.mappings.get((ptr - r.base) // g)
            if m is None or m.ptr != ptr or m.size != nbytes:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemUnmap",
                           "the range must be exactly one whole range mapped by cuMemMap (no sub-ranges)")
            first = (ptr - r.base) // g
            for i in range(first, first + nbytes // g):
                del r.mappings[i]
            m.handle.mappings -= 1
            self._vmm_free_if_unused(m.handle)

    def mem_set_access(self, ptr: int, nbytes: int, dev: int, flags: str = "readwrite") -> None:
        with self._lock:
            self._device(dev, "cuMemSetAccess")
            if flags not in ACCESS_FLAGS:
                raise ValueError(f"unsupported flags: {flags!r} (expected one of {list(ACCESS_FLAGS)})")
            r = self._reservation(ptr, nbytes, "cuMemSetAccess")
            g = self._devices[r.dev].spec.granularity
            if ptr % g or nbytes % g or nbytes <= 0:
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemSetAccess", f"range not aligned to the granularity {g}")
            first = (ptr - r.base) // g
            ms = [r.mappings.get(i) for i in range(first, first + nbytes // g)]
            if any(m is None for m in ms):
                raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemSetAccess", "the range is not fully mapped")
            for m in set(ms):
                if m.ptr < ptr or m.ptr + m.size > ptr + nbytes:
                    raise _err("CUDA_ERROR_INVALID_VALUE", "cuMemSetAccess",
                               "the range must contain whole mappings")
                m.access[dev] = flags

    def mapped_bytes(self) -> int:
        """Physical bytes currently backing VMM handles that are not yet freed (simulator only)."""
        return sum(h.size for h in self._vmm.values())
