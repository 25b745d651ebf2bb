"""Stream-ordered memory pools (cuMemPool*, cuMemAllocFromPoolAsync, IPC)."""
from __future__ import annotations

import struct

from ._model import ACCESS_FLAGS, POOL_ATTRIBUTES, _ALIGN, _Device, _Pool, _Region, _err, _oom

__all__ = ["PoolsMixin"]


class PoolsMixin:
    """Part of :class:`~mrkit.driver.sim.SimDriver`: stream-ordered memory pools (cuMemPool*, cuMemAllocFromPoolAsync, IPC)."""

    # ================================================================ inspection (public)
    def pools(self, *, include_default: bool = False) -> list[int]:
        """Handles of the memory pools that exist now (created and not destroyed; the devices'
        default pools only with ``include_default``)."""
        with self._lock:
            return [h for h, p in self._pools.items() if not p.destroyed and (include_default or not p.default)]

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
            self._injected(call, nbytes)
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
