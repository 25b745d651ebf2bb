"""The shadow checker and the memory map: host access, regions, vector-clock access checks."""
from __future__ import annotations

import bisect

from ._model import HOST, StreamOrderViolation, _ALIGN, _Rec, _Region, _oom

__all__ = ["CheckerMixin"]


class CheckerMixin:
    """Part of :class:`~mrkit.driver.sim.SimDriver`: the shadow checker and the memory map: host access, regions, vector-clock access checks."""

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
