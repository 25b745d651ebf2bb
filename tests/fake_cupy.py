"""A stand-in for the part of CuPy's allocator API mrkit uses, with CuPy's semantics, so the CuPy
integration is tested on the simulator in CI (the real CuPy runs in the GPU tests).

As in ``cupy/cuda/memory.pyx``: ``PythonFunctionAllocatorMemory(size, malloc_func, free_func,
device_id)`` calls ``malloc_func(size, device_id)`` when ``size > 0`` and, when dropped,
``free_func(ptr, device_id)``; ``UnownedMemory(ptr, size, owner, device_id)`` holds ``owner`` (whose
own finalizer frees); ``BaseMemory.size`` is what CuPy code reads as the block's size;
``CFunctionAllocator(param, malloc, free, owner)`` calls C functions by address (through
``ctypes.PYFUNCTYPE``, which raises a Python error the function left set, as CuPy 14's ``except *``
does); ``device.get_device_id()`` is the current device; ``get_current_stream(device_id)`` that device's
current stream. ``gc_clear(mem)`` does to a memory object what the garbage collector's ``tp_clear``
does to CuPy's (compiled, GC-tracked) classes when the object is part of a cycle: its object fields
become ``None`` before it is deallocated. ``make()`` builds a fresh module; ``install()`` also puts it in ``sys.modules``.
"""
from __future__ import annotations

import ctypes
import sys
import threading
import types


def make(devices: int = 1):
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    memory = types.ModuleType("cupy.cuda.memory")
    device = types.ModuleType("cupy.cuda.device")

    class FakeStream:
        def __init__(self, ptr):
            self.ptr = ptr

        def __cuda_stream__(self):
            return (0, self.ptr)

    class _State(threading.local):  # the current device is per thread, as in the CUDA runtime
        device = 0

    tls = _State()

    class StateView(dict):
        """``state["device"]`` reads and writes this thread's current device."""

        def __getitem__(self, key):
            return tls.device if key == "device" else dict.__getitem__(self, key)

        def __setitem__(self, key, value):
            if key == "device":
                tls.device = value
            else:
                dict.__setitem__(self, key, value)

    state = StateView(streams={}, allocator=None, pinned=None, calls=[])

    class PythonFunctionAllocatorMemory:
        def __init__(self, size, malloc_func, free_func, device_id):
            self._free_func, self.device_id, self.size, self.ptr = free_func, device_id, size, 0
            if size > 0:
                self.ptr = malloc_func(size, device_id)

        def __del__(self):
            if self.ptr:
                self._free_func(self.ptr, self.device_id)

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            if device_id < 0:
                raise AssertionError("mrkit must pass the device: a lookup would cost a driver call")
            self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id

    free_t = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)

    class CFunctionAllocatorMemory:
        """No object fields: ``no_gc`` in CuPy, so the collector never clears it."""

        def __init__(self, size, param, malloc_func, free_func, device_id):
            self._param, self._free, self.device_id, self.size, self.ptr = param, free_func, device_id, size, 0
            if size > 0:  # CuPy 14's _call_malloc: an error the C function leaves set is raised only when
                # it returns -1 (Cython's ``except? -1``); with any other value, SystemError
                from mrkit._engine._hotc import cupy_call_malloc
                self.ptr = cupy_call_malloc(param, malloc_func, size, device_id)

        def __del__(self):
            if self.ptr:
                free_t(self._free)(self._param, self.ptr, self.device_id)

    class CFunctionAllocator:
        def __init__(self, param, malloc_func, free_func, owner):
            self._args, self._owner = (param, malloc_func, free_func), owner

        def malloc(self, size):  # CuPy's ``malloc(self, size_t size)``: Cython's conversion first
            if not 0 <= size < 1 << 64:
                raise OverflowError("can't convert negative value to size_t" if size < 0 else
                                    "value too large to convert to size_t")
            p, m, f = self._args
            return MemoryPointer(CFunctionAllocatorMemory(size, p, m, f, state["device"]), 0)

    def gc_clear(mem):
        """``tp_clear``: CuPy's memory classes with object fields have them set to ``None``. A memory
        object whose type has a finalizer (a subclass defining ``__del__``) is put in a real reference
        cycle instead, for the collector: it runs finalizers before it clears anything (PEP 442), and its
        clear then empties the object's fields (the caller runs ``gc.collect()``)."""
        if "__del__" in type(mem).__dict__:
            mem.__dict__["_cycle"] = mem
            return
        if isinstance(mem, PythonFunctionAllocatorMemory):
            mem._free_func = None
        elif isinstance(mem, UnownedMemory):
            mem._owner = None

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, getattr(mem, "device_id", 0)

    class PythonFunctionAllocator:
        def __init__(self, malloc_func, free_func):
            self._malloc_func, self._free_func = malloc_func, free_func

        def malloc(self, size):
            return MemoryPointer(PythonFunctionAllocatorMemory(size, self._malloc_func, self._free_func,
                                                               state["device"]), 0)

    def get_device_id():
        return state["device"]

    def get_current_stream(device_id=-1):
        dev = state["device"] if device_id == -1 else device_id
        return state["streams"].get(dev) or FakeStream(0)

    def set_allocator(fn=None):
        state["calls"].append(("set_allocator", fn))
        state["allocator"] = fn

    def set_pinned_memory_allocator(fn=None):
        state["calls"].append(("set_pinned", fn))
        state["pinned"] = fn

    class Device:
        def __init__(self, i):
            self.id, self._prev = i, None

        def __enter__(self):
            self._prev, state["device"] = state["device"], self.id
            return self

        def __exit__(self, *exc):
            state["device"] = self._prev

    def empty(nbytes):
        """``cupy.empty((nbytes,), uint8)``: a MemoryPointer from the installed allocator."""
        return state["allocator"](nbytes)

    memory.PythonFunctionAllocatorMemory = PythonFunctionAllocatorMemory
    memory.PythonFunctionAllocator = PythonFunctionAllocator
    memory.UnownedMemory = UnownedMemory
    memory.CFunctionAllocator, memory.CFunctionAllocatorMemory = CFunctionAllocator, CFunctionAllocatorMemory
    memory.MemoryPointer = MemoryPointer
    device.get_device_id = get_device_id
    device.Device = Device
    cuda.memory, cuda.device, cuda.Device = memory, device, Device
    cuda.MemoryPointer, cuda.PythonFunctionAllocator = MemoryPointer, PythonFunctionAllocator
    cuda.PinnedMemoryPointer = lambda mem, offset: types.SimpleNamespace(mem=mem, ptr=mem.ptr + offset)
    cuda.get_current_stream = get_current_stream
    cuda.set_allocator, cuda.get_allocator = set_allocator, lambda: state["allocator"]
    cuda.set_pinned_memory_allocator = set_pinned_memory_allocator
    cupy.cuda, cupy.empty, cupy.__version__ = cuda, empty, "14.2.0"
    cupy.state, cupy.Stream = state, FakeStream
    cupy.devices, cupy.gc_clear = devices, gc_clear
    return cupy


def install(devices: int = 1):
    """A fresh fake CuPy in ``sys.modules`` (``cupy``, ``cupy.cuda``, ``cupy.cuda.memory``, ...)."""
    cupy = make(devices)
    sys.modules.update({"cupy": cupy, "cupy.cuda": cupy.cuda, "cupy.cuda.memory": cupy.cuda.memory,
                        "cupy.cuda.device": cupy.cuda.device})
    return cupy
