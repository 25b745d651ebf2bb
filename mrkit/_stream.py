"""Streams and events, and the normalisation of anything stream-like.

mrkit accepts, wherever a stream is asked for: a :class:`Stream`, :data:`DEFAULT_STREAM`, a raw
handle int, a ``cuda.bindings`` ``CUstream``, any object with ``__cuda_stream__`` (the CUDA Python
stream protocol, returning ``(0, handle)``), CuPy streams and PyTorch streams.

Each :class:`Stream` has a stable identity ``uid`` (``cuStreamGetId``) that survives handle reuse:
a destroyed stream's handle can be handed to a new stream by the driver, but never its ``uid``.
Normalising is cheap on the hot path: a :class:`Stream` is used as is; a foreign stream object is
converted once and cached for as long as the object lives (weakly keyed); a raw int handle is
looked up with one driver call each time (pass a :class:`Stream` to avoid it).
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from ._owned import Owned
from .driver import Driver, get_driver

__all__ = ["Stream", "Event", "DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM", "as_stream", "check_stream", "order_after",
           "stream_gone"]

_LEGACY_UID = -1
_PER_THREAD_UID = -2


class Stream(Owned):
    """A CUDA stream: owning (made by :meth:`create`, destroyed by :meth:`close`) or non-owning
    (:meth:`wrap`, :func:`as_stream`). ``driver`` is ``None`` only for the two default streams,
    which mean "the default stream of whichever driver and device uses them".

    Equality and hashing follow ``uid``, the driver's unique stream id, never the handle. A copy is
    the stream itself; only the two default streams pickle (as themselves).
    """

    __slots__ = ("handle", "uid", "device", "_driver", "_owning", "_closed", "_closing", "_owner_ref", "__weakref__")
    _pickle_advice = "; create a stream in the other process (the two default streams pickle)"

    def __reduce__(self):
        if self.uid == _LEGACY_UID:
            return "DEFAULT_STREAM"
        if self.uid == _PER_THREAD_UID:
            return "PER_THREAD_DEFAULT_STREAM"
        return super().__reduce__()

    def __init__(self, handle: int, uid: int, device: int | None, driver: Driver | None,
                 owning: bool = False, owner=None) -> None:
        self.handle = handle
        self.uid = uid
        self.device = device
        self._driver = driver
        self._owning = owning
        self._closed = False
        self._closing = threading.RLock() if owning else None  # held by close() and by hold()
        self._owner_ref = owner  # keeps a foreign owner alive when wrapped explicitly

    # -- construction -------------------------------------------------------------------
    @classmethod
    def create(cls, device: int = 0, *, nonblocking: bool = True, priority: int = 0,
               driver: Driver | None = None) -> "Stream":
        """Create an owning stream on ``device`` (non-blocking by default)."""
        drv = driver or get_driver()
        h = drv.stream_create(device, nonblocking, priority)
        return cls(h, drv.stream_get_id(h), device, drv, owning=True)

    @classmethod
    def wrap(cls, handle: int, *, driver: Driver | None = None, owner=None) -> "Stream":
        """A non-owning view of an existing stream handle (``owner`` is kept alive with it)."""
        if type(handle) is not int:
            raise TypeError(f"handle must be an int, not {type(handle).__name__}")
        if handle == 0 or handle == 1:
            return DEFAULT_STREAM
        if handle == 2:
            return PER_THREAD_DEFAULT_STREAM
        drv = driver or get_driver()
        return cls(handle, drv.stream_get_id(handle), drv.stream_get_device(handle), drv, owner=owner)

    # -- protocol and behaviour ------------------------------------------------------------
    @property
    def driver(self) -> Driver:
        return self._driver or get_driver()

    @property
    def is_default(self) -> bool:
        return self.uid < 0

    @property
    def alive(self) -> bool | None:
        """True/False when mrkit knows whether this stream still exists, None when it cannot tell
        (a raw handle whose lifetime belongs to someone else). The default streams are always alive;
        an owning stream until :meth:`close`; a wrapped CuPy/PyTorch/cuda.core stream while its owner
        object lives (explicit ``owner=``: for as long as this view lives)."""
        if self.uid < 0:
            return True
        if self._owning:
            return not self._closed
        ref = self._owner_ref
        if isinstance(ref, weakref.ref):
            return ref() is not None
        if ref is not None:
            return True  # an owner held strongly keeps the stream alive
        return None

    def hold(self) -> "_Held":
        """``with stream.hold() as alive:`` keeps the stream from being destroyed while inside, for work
        on it from a thread that does not own it: an owning stream's :meth:`close` (from any thread)
        waits until the block ends, and a wrapped stream's CuPy/cuda.core owner stays referenced.
        ``alive`` is :attr:`alive` read inside: use the handle only when it is ``True`` (mrkit's
        hand-overs and trims do, and wait for the device otherwise)."""
        return _Held(self)

    def __cuda_stream__(self):
        return (0, self.handle)

    def _live(self) -> int:
        """The handle, for a driver call; ``ValueError`` once mrkit knows the stream is gone."""
        if self.alive is False:
            raise stream_gone(self)
        return self.handle

    def synchronize(self) -> None:
        self.driver.stream_synchronize(self._live())

    def query(self) -> bool:
        """True when all work enqueued so far has completed."""
        return self.driver.stream_query(self._live())

    def record(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (a new one if omitted) on this stream and return it."""
        if event is None:
            event = Event.create(self.device or 0, driver=self.driver)
        event.record(self)
        return event

    def wait(self, other: "Event | Stream") -> None:
        """Make future work on this stream wait for ``other`` (an event, or all work so far on a stream)."""
        if isinstance(other, Event):
            self.driver.stream_wait_event(self._live(), other._live())
            return
        other = as_stream(other)
        order_after(self.driver, other.device or 0, self._live(), other._live())

    def close(self) -> None:
        """Destroy an owning stream (work already enqueued still completes); no-op otherwise. Waits
        while another thread holds the stream (:meth:`hold`)."""
        if self._owning and not self._closed:
            with self._closing:
                if self._closed:
                    return
                self._closed = True
                self._driver.stream_destroy(self.handle)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __eq__(self, other) -> bool:
        if not isinstance(other, Stream):
            return NotImplemented
        return self.uid == other.uid and (self._driver is other._driver or self.uid < 0)

    def __hash__(self) -> int:
        return hash(self.uid)

    def __repr__(self) -> str:
        if self.uid == _LEGACY_UID:
            return "mrkit.DEFAULT_STREAM"
        if self.uid == _PER_THREAD_UID:
            return "mrkit.PER_THREAD_DEFAULT_STREAM"
        kind = "owning" if self._owning else "borrowed"
        return f"<mrkit.Stream {kind} handle={self.handle:#x} id={self.uid} device={self.device}>"


class _Held:
    """What :meth:`Stream.hold` returns: a context manager whose value is whether the stream is alive,
    and which keeps it so until it exits."""

    __slots__ = ("_stream", "_owner", "_lock")

    def __init__(self, stream: Stream) -> None:
        self._stream, self._owner, self._lock = stream, None, None

    def __enter__(self) -> bool | None:
        s = self._stream
        if s._owning:
            self._lock = s._closing
            self._lock.acquire()  # close() waits until exit
        elif isinstance(s._owner_ref, weakref.ref):
            self._owner = s._owner_ref()  # a strong reference until exit: the owner cannot die meanwhile
        return s.alive

    def __exit__(self, *exc) -> None:
        lock, self._lock, self._owner = self._lock, None, None
        if lock is not None:
            lock.release()


#: The legacy default stream (handle 0) of whichever device and driver uses it.
DEFAULT_STREAM = Stream(0, _LEGACY_UID, None, None)
#: The per-thread default stream (handle 2).
PER_THREAD_DEFAULT_STREAM = Stream(2, _PER_THREAD_UID, None, None)


class Event(Owned):
    """A CUDA event (timing disabled). Owning; :meth:`close` destroys it."""

    __slots__ = ("handle", "device", "_driver", "_closed")

    def __init__(self, handle: int, device: int, driver: Driver) -> None:
        self.handle, self.device, self._driver, self._closed = handle, device, driver, False

    @classmethod
    def create(cls, device: int = 0, *, driver: Driver | None = None) -> "Event":
        drv = driver or get_driver()
        return cls(drv.event_create(device), device, drv)

    def _live(self) -> int:
        if self._closed:
            raise ValueError(f"{self!r} is closed: its handle may no longer be used")
        return self.handle

    def record(self, stream) -> None:
        self._driver.event_record(self._live(), as_stream(stream)._live())

    def query(self) -> bool:
        return self._driver.event_query(self._live())

    def synchronize(self) -> None:
        self._driver.event_synchronize(self._live())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._driver.event_destroy(self.handle)

    def __enter__(self) -> "Event":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<mrkit.Event handle={self.handle:#x} device={self.device}>"


_foreign: "weakref.WeakKeyDictionary[object, Stream]" = weakref.WeakKeyDictionary()

# Packages whose stream classes are Python classes or Cython extension types: either way the object
# drops its weak references when it dies (CPython's subtype_dealloc, or Cython's generated dealloc).
_CLEARS_WEAKREFS = frozenset({"cupy", "cupy_backends", "cuda", "numba", "mrkit"})
_weakref_safe_types: dict = {}


def _weakref_safe(tp: type) -> bool:
    """Whether objects of ``tp`` drop their weak references when they die, so that mrkit may watch one
    through a weak reference. The class that gave ``tp`` its weak-reference slot decides: in one made by
    a class statement (its ``__weakref__`` descriptor is CPython's) CPython clears them; a C extension
    type clears them in its own dealloc, which the packages in ``_CLEARS_WEAKREFS`` do and others may
    not (a PyTorch CUDA stream freed its memory with a weak reference still pointing at it: the
    reference then read freed memory, and the process crashed at exit when the cache of foreign
    streams was cleared)."""
    safe = _weakref_safe_types.get(tp)
    if safe is None:
        giver = next((c for c in reversed(tp.__mro__) if c.__weakrefoffset__), None)
        safe = giver is not None and ("__weakref__" in giver.__dict__
                                      or (giver.__module__ or "").split(".")[0] in _CLEARS_WEAKREFS)
        _weakref_safe_types[tp] = safe
    return safe


def _foreign_handle(obj) -> int:
    proto = getattr(type(obj), "__cuda_stream__", None)
    if proto is not None:
        info = obj.__cuda_stream__()
        if not (isinstance(info, tuple) and len(info) == 2 and info[0] == 0 and isinstance(info[1], int)):
            raise TypeError(f"stream: {type(obj).__name__}.__cuda_stream__() must return (0, handle), got {info!r}")
        if info[1] < 0:
            raise ValueError(f"stream handle must be >= 0, got {info[1]} from {type(obj).__name__}.__cuda_stream__()")
        return info[1]
    mod = type(obj).__module__ or ""
    name = type(obj).__name__
    if name == "CUstream" and mod.startswith("cuda"):
        return int(obj)
    if mod.startswith("cupy") and hasattr(obj, "ptr"):
        return int(obj.ptr)
    if mod.startswith("torch") and hasattr(obj, "cuda_stream"):
        return int(obj.cuda_stream)
    raise TypeError(f"stream must be a mrkit.Stream, a stream handle int, or an object with "
                    f"__cuda_stream__ (CuPy, PyTorch, cuda.core), not {type(obj).__name__}")


def stream_gone(stream: Stream) -> ValueError:
    """The error of an allocation on ``stream`` once mrkit knows it is gone (``alive is False``): its
    handle must not reach the driver (a destroyed stream's handle is undefined behaviour there)."""
    return ValueError(f"stream {stream!r} is closed (or the object that owned it was collected): nothing "
                      "can be ordered on it or waited for; use a live stream")


def as_stream(obj, driver: Driver | None = None) -> Stream:
    """Normalise a stream-like (see the module docstring) to a :class:`Stream`."""
    if type(obj) is Stream:
        return obj
    if obj is None:
        raise TypeError("stream is required: pass mrkit.DEFAULT_STREAM for the default stream")
    if isinstance(obj, bool):
        raise TypeError("stream must be a stream-like, not bool")
    if isinstance(obj, int):
        if obj < 0:
            raise ValueError(f"stream handle must be >= 0, got {obj}")
        return Stream.wrap(obj, driver=driver)
    if isinstance(obj, Stream):
        return obj
    if not _weakref_safe(type(obj)):
        # no weak reference to it (one could outlive the object): converted each time, as a raw handle
        # is, and as for a raw handle mrkit cannot tell whether the stream still exists (alive is None)
        return Stream.wrap(_foreign_handle(obj), driver=driver)
    try:
        cached = _foreign.get(obj)
    except TypeError:  # not hashable / not weak-referenceable: convert every time
        return Stream.wrap(_foreign_handle(obj), driver=driver)
    if cached is not None:
        return cached
    s = Stream.wrap(_foreign_handle(obj), driver=driver)
    if s.uid >= 0:
        # Remember the owner weakly: while it lives its handle names this stream; once it is
        # collected, the stream may be gone (pools then fall back to a device synchronise).
        s._owner_ref = weakref.ref(obj)
        _foreign[obj] = s
    return s


def stream_handle(obj) -> int:
    """The raw handle of a stream-like (see the module docstring), without building a :class:`Stream`."""
    if isinstance(obj, Stream):
        return obj.handle
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    return _foreign_handle(obj)


def device_scope(driver: Driver, device: int, *streams: "Stream"):
    """``driver.on_device(device)`` when any of ``streams`` is a default stream (whose meaning is
    "the current context's"), else a no-op context: a default stream given to a resource of
    ``device`` is that device's default stream, whichever device the caller has current."""
    for s in streams:
        if s.uid < 0:
            return driver.on_device(device)
    return contextlib.nullcontext()


def order_after(driver: Driver, device: int, waiter: int, signaller: int) -> None:
    """Make future work on stream handle ``waiter`` wait for the work queued so far on ``signaller``
    (one temporary event)."""
    ev = driver.event_create(device)
    try:
        driver.event_record(ev, signaller)
        driver.stream_wait_event(waiter, ev)
    finally:
        driver.event_destroy(ev)


def check_stream(obj) -> None:
    """Validate a stream-like without touching a driver (for host-only resources)."""
    if obj is None:
        raise TypeError("stream is required: pass mrkit.DEFAULT_STREAM for the default stream")
    if isinstance(obj, (Stream, int)) and not isinstance(obj, bool):
        if isinstance(obj, int) and obj < 0:
            raise ValueError(f"stream handle must be >= 0, got {obj}")
        return
    if isinstance(obj, bool):
        raise TypeError("stream must be a stream-like, not bool")
    _foreign_handle(obj)
