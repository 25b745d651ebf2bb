"""The simulator's data model: devices, streams, events, regions, pools, VMM handles, sparse bytes."""
from __future__ import annotations

import bisect
import itertools
import random
import struct
import threading
from collections import deque
from dataclasses import dataclass, field

from ..._errors import CUDAError, OutOfMemoryError, StreamOrderViolation
from .._base import ACCESS_FLAGS, DEVICE_CAPABILITIES, MANAGED_ADVICE, POOL_ATTRIBUTES, VMM_HANDLE_TYPES, Driver

__all__ = ["SimDriver", "SimDeviceSpec"]

_ERRORS = {
    "CUDA_ERROR_INVALID_VALUE": (1, "invalid argument"),
    "CUDA_ERROR_OUT_OF_MEMORY": (2, "out of memory"),
    "CUDA_ERROR_INVALID_DEVICE": (101, "invalid device ordinal"),
    "CUDA_ERROR_INVALID_HANDLE": (400, "invalid resource handle"),
    "CUDA_ERROR_NOT_READY": (600, "device not ready"),
    "CUDA_ERROR_NOT_SUPPORTED": (801, "operation not supported"),
    "CUDA_ERROR_UNKNOWN": (999, "unknown error"),
    "CUDA_ERROR_ILLEGAL_ADDRESS": (700, "an illegal memory access was encountered"),
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

    @staticmethod
    def _pieces(off: int, n: int):
        """``(pos, chunk index, offset in chunk, length)`` for each chunk ``[off, off+n)`` touches."""
        pos = 0
        while pos < n:
            ci, co = divmod(off + pos, _PAGE)
            take = min(_PAGE - co, n - pos)
            yield pos, ci, co, take
            pos += take

    def read(self, off: int, n: int) -> bytes:
        out = bytearray(n)
        for pos, ci, co, take in self._pieces(off, n):
            ch = self.chunks.get(ci)
            if ch is not None:
                out[pos:pos + take] = ch[co:co + take]
        return bytes(out)

    def write(self, off: int, data: bytes) -> None:
        for pos, ci, co, take in self._pieces(off, len(data)):
            ch = self.chunks.get(ci)
            if ch is None:
                ch = self.chunks[ci] = bytearray(_PAGE)
            ch[co:co + take] = data[pos:pos + take]

    def fill(self, off: int, n: int, value: int) -> None:
        pattern = _PATTERNS.get(value)
        if pattern is None:
            pattern = _PATTERNS[value] = memoryview(bytes([value]) * _PAGE)
        for _, ci, co, take in self._pieces(off, n):
            ch = self.chunks.get(ci)
            if ch is None:
                if value == 0:
                    continue
                ch = self.chunks[ci] = bytearray(_PAGE)
            ch[co:co + take] = pattern[:take]

    def equal(self, off: int, n: int, value: int) -> bool:
        """Whether every byte of ``[off, off+n)`` is ``value`` (no copy)."""
        for _, ci, co, take in self._pieces(off, n):
            ch = self.chunks.get(ci)
            if (value != 0) if ch is None else ch.count(value, co, co + take) != take:
                return False
        return True


_PATTERNS: dict[int, memoryview] = {}  # value -> one page of it, for fills


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
