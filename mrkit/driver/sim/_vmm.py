"""Virtual memory management (reserve, create, map, set access, unmap, release)."""
from __future__ import annotations


from ._model import ACCESS_FLAGS, VMM_HANDLE_TYPES, _Device, _Handle, _Mapping, _PAGE, _Region, _err

__all__ = ["VmmMixin"]


class VmmMixin:
    """Part of :class:`~mrkit.driver.sim.SimDriver`: virtual memory management (reserve, create, map, set access, unmap, release)."""

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
            self._injected("cuMemCreate", nbytes)
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
