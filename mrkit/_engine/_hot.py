"""The arena's hot path, as closures over one arena's structures.

Three variants share one shape and differ only in what they add:

* :func:`plain_paths` — ``allocate(nbytes, stream, alignment=256)`` / ``deallocate(ptr, nbytes,
  stream, alignment=256)``: a caching resource's own methods;
* :func:`counting_paths` — the same, appending ``+nbytes`` / ``-nbytes`` to an event list
  (:class:`~mrkit.StatisticsAdaptor` fuses this in, so counting costs no Python frame of its own);
* :func:`hook_paths` — ``malloc(nbytes, device_id)`` / ``free(ptr, device_id)`` for allocator hooks that
  name no stream and free by pointer alone (CuPy's): they find the caller's current stream and
  remember each block's stream until it is freed.

The lock-free part reads only single atomic built-in operations (locking rule 1 in
``docs/design.md``): ``states.get(uid)``, a cache list's ``pop``/``append``, ``cache.get``, ``live[ptr] = n`` / ``live.pop(ptr)``. A retired state's cache is ``None``
(rule 4): ``None.get`` raises ``AttributeError`` and the path falls back to the lock. A free appends,
then checks that its cache is still attached (rule 3); if not, it rescues the block under the lock.
Everything else is ``Arena`` code under ``arena.lock``.

The paths are written once below as module-level template functions; each factory makes copies of
them (``types.FunctionType`` over the same code) whose globals are that arena's own structures and
bound methods, so a call makes no attribute look-up and reads each name with one specialised global
load. Tracebacks and coverage point at the lines below.
"""
from __future__ import annotations

import builtins
import types

from .._resource import DEFAULT_ALIGNMENT, check_request
from .._stream import Stream

__all__ = ["plain_paths", "counting_paths", "hook_paths"]


def _checked_free_args(nbytes, alignment):
    """Validate a free's ``nbytes`` and ``alignment`` before anything is touched: ints (numpy integers
    and anything with ``__index__`` are converted), ``nbytes >= 0``, ``alignment`` a power of two."""
    return check_request(nbytes, alignment, 1 << 62), alignment.__index__()


def _plain_allocate(nbytes, stream, alignment=256):
    """Allocate ``nbytes`` for work on ``stream``: an exact-size cache hit takes no lock."""
    if type(stream) is not Stream:
        stream = to_stream(stream)
    if type(nbytes) is not int or nbytes <= 0 or alignment is not DEFAULT_ALIGNMENT:
        return allocate_slow(nbytes, stream, alignment)
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        try:
            lst = st.cache.get(size)
        except AttributeError:  # retired: the cache is None
            lst = None
        if lst:
            try:
                ptr = lst.pop()
            except IndexError:  # another thread took the last one
                pass
            else:
                live[ptr] = nbytes
                return ptr
    with lock:
        ptr = take(size, stream)
        live[ptr] = nbytes
    return ptr

def _plain_deallocate(ptr, nbytes, stream, alignment=256):
    """Return ``ptr`` (``nbytes`` as allocated) on ``stream``: into that stream's exact-size cache,
    without a lock unless the cache was detached meanwhile."""
    if type(stream) is not Stream:
        stream = to_stream(stream)
    if type(nbytes) is not int or alignment is not DEFAULT_ALIGNMENT:
        nbytes, alignment = _checked_free_args(nbytes, alignment)
        if alignment > 256:  # an aligned block, or an alignment that does not match: the lock decides
            with lock:
                deallocate_slow(ptr, nbytes, stream, alignment)
            return
    n = live_pop(ptr, None)
    if n != nbytes:  # zero, aligned blocks, and every error: the locked path decides
        if n is not None:
            live[ptr] = n
        with lock:
            deallocate_slow(ptr, nbytes, stream, alignment)
        return
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        cache = st.cache
        try:
            lst = cache.get(size)
        except AttributeError:  # retired
            pass
        else:
            if lst is not None:  # a hot size: cached for the next request of that size
                lst.append(ptr)
                if st.cache is cache:  # rule 3: still attached, so the block is where it belongs
                    return
                with lock:
                    rescue(lst, size, stream)
                return
    with lock:  # any other size coalesces into the free list now
        free_block(ptr, size, stream)

def plain_paths(arena):
    """``(allocate, deallocate)`` over ``arena``: the resource protocol's two methods."""
    ns = _namespace(arena)
    return _instance(_plain_allocate, ns), _instance(_plain_deallocate, ns)


def _counting_allocate(nbytes, stream, alignment=256):
    """Allocate as the arena does, and count it."""
    if type(stream) is not Stream:
        stream = to_stream(stream)
    if type(nbytes) is not int or nbytes <= 0 or alignment is not DEFAULT_ALIGNMENT:
        ptr = allocate_slow(nbytes, stream, alignment)
        if ptr:
            counted[ptr] = n = nbytes.__index__()
            record(n)
        return ptr
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        try:
            lst = st.cache.get(size)
        except AttributeError:
            lst = None
        if lst:
            try:
                ptr = lst.pop()
            except IndexError:
                pass
            else:
                live[ptr] = nbytes
                counted[ptr] = nbytes
                record(nbytes)
                return ptr
    with lock:
        ptr = take(size, stream)
        live[ptr] = nbytes
    counted[ptr] = nbytes
    record(nbytes)
    return ptr

def _counting_deallocate(ptr, nbytes, stream, alignment=256):
    """Free as the arena does, and count it (pending events stay within ``limit`` + live blocks)."""
    if type(stream) is not Stream:
        stream = to_stream(stream)
    if type(nbytes) is not int or alignment is not DEFAULT_ALIGNMENT:
        nbytes, alignment = _checked_free_args(nbytes, alignment)
        if alignment > 256:
            return free_slow(ptr, nbytes, stream, alignment)
    n = live_pop(ptr, None)
    if n != nbytes:
        if n is not None:
            live[ptr] = n
        return free_slow(ptr, nbytes, stream, alignment)
    if counted_pop(ptr, None) is not None:  # memory the adaptor never counted goes home uncounted
        record(-nbytes)
        if len(events) > limit:
            on_full()
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        cache = st.cache
        try:
            lst = cache.get(size)
        except AttributeError:
            pass
        else:
            if lst is not None:
                lst.append(ptr)
                if st.cache is cache:
                    return
                with lock:
                    rescue(lst, size, stream)
                return
    with lock:
        free_block(ptr, size, stream)

def counting_paths(arena, events: list, on_full, limit: int, counted: dict):
    """:func:`plain_paths` that append ``+nbytes`` to ``events`` for each allocation and ``-nbytes``
    for each free of a block they counted (``counted``: ptr -> nbytes), calling ``on_full()`` when a
    free finds more than ``limit`` events pending."""
    record, lock, deallocate_slow = events.append, arena.lock, arena.deallocate_slow

    def free_slow(ptr, nbytes, stream, alignment):
        """A free the lock-free path did not accept (zero, aligned blocks, errors), counted when the
        adaptor counted the block; an error leaves the block counted, as it leaves it live."""
        c = counted.pop(ptr, None)  # forgotten first: once freed, another thread may get ptr again
        try:
            with lock:
                deallocate_slow(ptr, nbytes, stream, alignment)
        except BaseException:
            if c is not None:
                counted[ptr] = c
            raise
        if c is not None:
            record(-nbytes)
            if len(events) > limit:
                on_full()

    ns = _namespace(arena, events=events, on_full=on_full, limit=limit, record=record,
                    counted=counted, counted_pop=counted.pop, free_slow=free_slow)
    return _instance(_counting_allocate, ns), _instance(_counting_deallocate, ns)


def _hook_malloc(nbytes, device_id):
    """Allocate ``nbytes`` on the caller's current stream of ``device_id`` (the device these hooks
    were made for: the caller dispatches by device, so it is not checked again here)."""
    cs = current_stream(device_id)
    ref, stream = seen[0]
    if ref() is not cs:
        stream = remember(cs)
    if type(nbytes) is not int or nbytes <= 0:
        ptr = allocate_slow(nbytes, stream, 256)
        if ptr:
            where[ptr] = stream
        return ptr
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        try:
            lst = st.cache.get(size)
        except AttributeError:
            lst = None
        if lst:
            try:
                ptr = lst.pop()
            except IndexError:
                pass
            else:
                live[ptr] = nbytes
                where[ptr] = stream
                return ptr
    with lock:
        ptr = take(size, stream)
        live[ptr] = nbytes
    where[ptr] = stream
    return ptr

def _hook_free(ptr, device_id):
    """Free ``ptr`` on the stream it was allocated on."""
    stream = where_pop(ptr, None)
    if stream is None:
        return foreign_free(ptr)
    nbytes = live_pop(ptr, None)
    if nbytes is None:  # cannot happen while ``where`` and ``live`` agree; the lock decides
        with lock:
            deallocate_slow(ptr, -1, stream, 256)
        return
    size = (nbytes + 255) & -256
    st = states_get(stream.uid)
    if st is not None:
        cache = st.cache
        try:
            lst = cache.get(size)
        except AttributeError:
            pass
        else:
            if lst is not None:
                lst.append(ptr)
                if st.cache is cache:
                    return
                with lock:
                    rescue(lst, size, stream)
                return
    with lock:
        free_block(ptr, size, stream)

def hook_paths(arena, *, current_stream, seen: list, remember, foreign_free):
    """``(malloc(nbytes, device_id), free(ptr, device_id))`` over ``arena`` for allocator hooks:

    the caller hands each device its own pair (CuPy's ``Memory`` passes back the device it was made
    with), so the hooks do not check it;
    ``current_stream(device_id)`` gives the caller's current stream object; ``seen`` is a one-element
    list holding ``(weakref to the last stream object, its mrkit Stream)`` and ``remember(obj)``
    converts a stream object and updates ``seen``; ``foreign_free(ptr)`` handles a pointer these hooks
    never handed out. Each live block's stream is remembered until it is freed."""
    where: dict[int, Stream] = {}
    ns = _namespace(arena, current_stream=current_stream,
                    seen=seen, remember=remember, foreign_free=foreign_free, where=where,
                    where_pop=where.pop)
    return _instance(_hook_malloc, ns), _instance(_hook_free, ns)


def _namespace(arena, **extra) -> dict:
    """The globals of one arena's hot path: its structures and bound methods, bound once."""
    live = arena.live
    return {"__builtins__": builtins, "Stream": Stream, "_checked_free_args": _checked_free_args,
            "DEFAULT_ALIGNMENT": DEFAULT_ALIGNMENT,
            "live": live, "live_pop": live.pop, "lock": arena.lock, "states_get": arena.states.get,
            "take": arena.take, "to_stream": arena.as_stream, "allocate_slow": arena.allocate_slow,
            "deallocate_slow": arena.deallocate_slow, "rescue": arena.rescue,
            "free_block": arena.free_block, **extra}


def _instance(template, ns: dict):
    """A copy of ``template`` whose globals are ``ns`` (one arena's structures)."""
    fn = types.FunctionType(template.__code__, ns, template.__name__.split("_", 2)[2], template.__defaults__)
    fn.__doc__ = template.__doc__
    fn.__qualname__ = fn.__name__
    return fn
