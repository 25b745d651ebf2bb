"""DLPack export of mrkit memory (zero-copy), with ctypes only.

``Buffer.__dlpack__`` describes the buffer as a writable 1-D ``uint8`` tensor: a DLPack 1.x
``"dltensor_versioned"`` capsule when the consumer asks for ``max_version >= (1, 0)``, else a legacy
``"dltensor"`` capsule (DLPack 0.8 ABI). ``Buffer.__dlpack_device__`` answers the device. The buffer
stays alive until the consumer calls the tensor's deleter (or the capsule is dropped unconsumed).
"""
from __future__ import annotations

import atexit
import ctypes

__all__ = ["to_dlpack_capsule", "dlpack_device", "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "KDL_CUDA_MANAGED"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    pass


_DeleterVersioned = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensorVersioned))
_DLManagedTensorVersioned._fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                      ("deleter", _DeleterVersioned), ("flags", ctypes.c_uint64),
                                      ("dl_tensor", _DLTensor)]

_live: dict[int, tuple] = {}  # address of the managed tensor -> what must stay alive

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# Used only inside the capsule destructor, where the capsule is being deallocated: take it as a raw
# pointer so that ctypes never makes a new reference to a dying object.
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@_Deleter
def _delete(managed) -> None:
    _live.pop(ctypes.addressof(managed.contents), None)


@_DeleterVersioned
def _delete_versioned(managed) -> None:
    _live.pop(ctypes.addressof(managed.contents), None)


def _disarm_at_exit() -> None:
    """At interpreter exit a consumer may release its tensors after Python can no longer run
    callbacks: clear the deleters (DLPack allows NULL) and let the process reclaim the memory."""
    for mt, _shape, buf in list(_live.values()):
        mt.deleter = type(mt.deleter)()
        buf.resource = None  # nothing to free at exit
    # The consumer may still read the tensor structs during its own teardown: never free them.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_live))


atexit.register(_disarm_at_exit)

_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _capsule_destructor(capsule) -> None:
    # Unconsumed capsules keep their name; consumers rename them "used_dltensor[_versioned]".
    for name in (b"dltensor", b"dltensor_versioned"):
        if _api.PyCapsule_IsValid(capsule, name):
            _live.pop(_api.PyCapsule_GetPointer(capsule, name), None)


def dlpack_device(buf) -> tuple[int, int]:
    mr = buf.resource
    if mr is None:
        raise ValueError("the buffer is closed")
    dev = mr.device_id or 0
    if mr.device_accessible and mr.host_accessible:
        kind = type(_root(mr)).__name__
        return (KDL_CUDA_MANAGED, dev) if "Managed" in kind else (KDL_CUDA_HOST, 0)
    if mr.device_accessible:
        return (KDL_CUDA, dev)
    return (KDL_CPU, 0)


def _root(mr):
    seen = set()
    while hasattr(mr, "upstream") and id(mr) not in seen:
        seen.add(id(mr))
        mr = mr.upstream
    return mr


def _fill(t: _DLTensor, buf, shape) -> None:
    dev_type, dev_id = dlpack_device(buf)
    t.data = buf.ptr or None
    t.device = _DLDevice(dev_type, dev_id)
    t.ndim = 1
    t.dtype = _DLDataType(1, 8, 1)  # kDLUInt, 8 bits
    t.shape = shape
    t.strides = None
    t.byte_offset = 0


def to_dlpack_capsule(buf, versioned: bool = False):
    """A capsule viewing ``buf`` as ``uint8[size]``; keeps ``buf`` alive until deleted.
    ``versioned`` gives a DLPack 1.x ``"dltensor_versioned"`` capsule (writable, not a copy)."""
    shape = (ctypes.c_int64 * 1)(buf.size)
    if versioned:
        mt = _DLManagedTensorVersioned()
        mt.version = _DLPackVersion(1, 0)
        mt.flags = 0
        mt.deleter = _delete_versioned
        name = b"dltensor_versioned"
    else:
        mt = _DLManagedTensor()
        mt.deleter = _delete
        name = b"dltensor"
    mt.manager_ctx = None
    _fill(mt.dl_tensor, buf, shape)
    addr = ctypes.addressof(mt)
    _live[addr] = (mt, shape, buf)
    return _api.PyCapsule_New(addr, name, ctypes.cast(_capsule_destructor, ctypes.c_void_p))
