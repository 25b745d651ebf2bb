"""Plain, pinned and managed allocation, and data movement."""
from __future__ import annotations


from ._model import MANAGED_ADVICE, StreamOrderViolation, _Device, _Region, _err, _oom

__all__ = ["MemoryMixin"]


class MemoryMixin:
    """Part of :class:`~mrkit.driver.sim.SimDriver`: plain, pinned and managed allocation, and data movement."""

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
            self._injected("cuMemAlloc", nbytes)
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
            self._injected("cuMemHostAlloc", nbytes)
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
            self._injected("cuMemAllocManaged", nbytes)
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

    def verify_async(self, ptr, nbytes, value, stream, report) -> None:
        """A kernel on ``stream`` that reads ``[ptr, ptr+nbytes)`` (checked by the race checker like
        any read) and, when it runs, calls ``report(found)`` with the sorted distinct byte values if
        any byte differs from ``value``. Nothing is synchronised: the check orders nothing."""
        def factory(s):
            def run():
                segs = self._exec_segments(ptr, nbytes, "verify", s.dev, False)
                if not all(b.equal(o, n, value) for b, o, n in segs):
                    data = b"".join(b.read(o, n) for b, o, n in segs)
                    report(sorted(set(data))[:8])
            return run
        self._op_access(stream, [(ptr, nbytes, "read")], "kernel", factory,
                        f"kernel verifying [{ptr:#x}, +{nbytes}) == {value}")

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
