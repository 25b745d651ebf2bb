"""Versions, devices, contexts, streams and events."""
from __future__ import annotations

import contextlib


from ._model import DEVICE_CAPABILITIES, _Event, _Stream, _err

__all__ = ["StreamsMixin"]


class StreamsMixin:
    """Part of :class:`~mrkit.driver.sim.SimDriver`: versions, devices, contexts, streams and events."""

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

    def current_device(self) -> int:
        return getattr(self._tls, "dev", 0)

    @contextlib.contextmanager
    def on_device(self, dev: int):
        self._device(dev, "cuCtxSetCurrent")
        prev = getattr(self._tls, "dev", None)
        self._tls.dev = dev
        try:
            yield
        finally:
            if prev is None:
                del self._tls.dev
            else:
                self._tls.dev = prev

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
