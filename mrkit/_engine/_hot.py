"""The arena's hot path in the Python build: closures over one arena's structures.

Four variants share one shape (each a single frame: a shared helper would cost every call a frame)
and differ only in what they add:

* :func:`plain_paths` — ``allocate(nbytes, stream, alignment=256)`` / ``deallocate(ptr, nbytes,
  stream, alignment=256)``: a caching resource's own methods;
* :func:`counting_paths` — the same, appending ``+nbytes`` / ``-nbytes`` to an event list
  (:class:`~mrkit.StatisticsAdaptor` fuses this in, so counting costs no Python frame of its own);
* :func:`hook_paths` — ``malloc(nbytes, device_id)`` / ``free(ptr, device_id)`` for allocator hooks that
  name no stream and free by pointer alone (CuPy's): they find the caller's current stream and
  remember each block's stream until it is freed;
* :func:`route_paths` — ``route(size)``: the Python build's whole CuPy entry point, returning CuPy's
  pointer whose memory object (a subclass of CuPy's ``UnownedMemory``) frees the block from its
  finalizer.

The lock-free part reads only single atomic built-in operations (locking rule 1 in
``docs/design.md``): ``states.get(uid)``, a cache list's ``pop``/``append``, ``cache.get``,
``live[ptr] = n`` / ``live.pop(ptr)``. A retired state's cache is ``None`` (rule 4): ``None.get``
raises ``AttributeError`` and the path falls back to the lock. A free appends, then checks that its
cache is still attached (rule 3); if not, it rescues the block under the lock. Everything else is
``Arena`` code under ``arena.lock``.

Every name the lock-free steps read is a variable of the factory that made it (builtins included), so a
cache hit makes no global or attribute look-up, and the paths keep working while the interpreter tears
modules down. The locked steps read the arena's attributes (``arena.take``, ``arena.free_block``, …):
each name a closure holds costs every call (CPython copies them into the frame), a look-up only the
calls that need it.
The compiled build (``_hotc.pyx``) implements the first three, line for line (CuPy calls its C hooks
where the Python build has :func:`route_paths`); the kit's
controlled interleavings and the mutation suite run on these (see :func:`mrkit._engine.python_core`).
"""
from __future__ import annotations

from .._resource import DEFAULT_ALIGNMENT, check_request, check_size
from .._stream import Stream
from ._freelist import FreeList

__all__ = ["plain_paths", "counting_paths", "hook_paths", "route_paths", "rounded_size", "checked_free_args", "FreeList", "Misses", "Boundaries"]

Boundaries = set  # chunk bases, blocks never coalesce across one (the compiled build's is a sorted C array)


class Misses:
    """The sizes that missed the cache lately (touched only under the arena's lock): :meth:`note`
    counts a miss and says whether the same size has now missed again within ``distance`` misses of
    its last miss ``repeats`` times in a row, which makes it worth a cache list. A size of at most
    ``small`` bytes is judged by ``small_distance`` instead (``small`` 0: none is). At most
    ``capacity`` sizes are remembered; past that it starts afresh."""

    __slots__ = ("last", "runs", "count", "distance", "capacity", "repeats", "small", "small_distance")

    def __init__(self, distance: int, capacity: int, repeats: int = 1, small: int = 0,
                 small_distance: int = 0) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        if small < 0 or small_distance < 0:
            raise ValueError(f"small and small_distance must be >= 0, got {small} and {small_distance}")
        self.last: dict[int, int] = {}  # size -> the count at its last miss
        self.runs: dict[int, int] = {}  # size -> how many times in a row it missed again in time
        self.count = 0
        self.distance, self.capacity, self.repeats = distance, capacity, repeats
        self.small, self.small_distance = small, small_distance

    def note(self, size: int) -> bool:
        last, runs = self.last, self.runs
        n = self.count = self.count + 1
        prev = last.get(size)
        again = prev is not None and n - prev <= (self.small_distance if size <= self.small else self.distance)
        if not again and len(last) >= self.capacity:
            last.clear()
            runs.clear()
        last[size] = n
        if not again:
            runs.pop(size, None)
            return False
        r = runs[size] = runs.get(size, 0) + 1
        return r >= self.repeats


def checked_free_args(nbytes, alignment):
    """Validate a free's ``nbytes`` and ``alignment`` before anything is touched: ints (numpy integers
    and anything with ``__index__`` are converted), ``nbytes >= 0``, ``alignment`` a power of two."""
    return check_request(nbytes, alignment, 1 << 62), alignment.__index__()


def plain_paths(arena):
    """``(allocate, deallocate)`` over ``arena``: the resource protocol's two methods."""
    live, lock, states_get, live_pop = arena.live, arena.lock, arena.states.get, arena.live.pop
    _Stream, _int, _type, _default, _checked = Stream, int, type, DEFAULT_ALIGNMENT, checked_free_args
    _AttributeError, _IndexError = AttributeError, IndexError

    def allocate(nbytes, stream, alignment=256):
        """Allocate ``nbytes`` for work on ``stream``: an exact-size cache hit takes no lock."""
        if _type(stream) is not _Stream:
            stream = arena.as_stream(stream)
        if _type(nbytes) is not _int or nbytes <= 0 or alignment is not _default:
            return arena.allocate_slow(nbytes, stream, alignment)
        size = (nbytes + 255) & -256
        st = states_get(stream.uid)
        if st is not None:
            try:
                lst = st.cache.get(size)
            except _AttributeError:  # retired: the cache is None
                lst = None
            if lst:
                try:
                    ptr = lst.pop()
                except _IndexError:  # another thread took the last one
                    pass
                else:
                    live[ptr] = nbytes
                    return ptr
        if lock._is_owned():  # a finalizer allocating inside this thread's locked step
            arena.nested_allocation(nbytes)
        with lock:
            ptr = arena.take(size, stream)
            live[ptr] = nbytes
        return ptr

    def deallocate(ptr, nbytes, stream, alignment=256):
        """Return ``ptr`` (``nbytes`` as allocated) on ``stream``: into that stream's exact-size cache,
        without a lock unless the cache was detached meanwhile."""
        if _type(stream) is not _Stream:
            stream = arena.as_stream(stream)
        if _type(nbytes) is not _int or alignment is not _default or _type(ptr) is not _int:
            nbytes, alignment = _checked(nbytes, alignment)
            if alignment > 256 or _type(ptr) is not _int:  # an aligned block, an alignment that does
                arena.free_slow(ptr, nbytes, stream, alignment)  # not match, a pointer that is not an
                return  # int (a float equal to a live one, a NumPy int): the checked path decides
        n = live_pop(ptr, None)
        if n != nbytes:  # zero, aligned blocks, and every error: the locked path decides
            if n is not None:
                live[ptr] = n
            arena.free_slow(ptr, nbytes, stream, alignment)
            return
        size = (nbytes + 255) & -256
        st = states_get(stream.uid)
        if st is not None:
            cache = st.cache
            try:
                lst = cache.get(size)
            except _AttributeError:  # retired
                pass
            else:
                if lst is not None:  # a hot size: cached for the next request of that size
                    lst.append(ptr)
                    if st.cache is cache:  # rule 3: still attached, so the block is where it belongs
                        return
                    arena.rescue(lst, size, stream)
                    return
        arena.free_or_defer(ptr, size, stream)  # any other size coalesces into the free list now

    return allocate, deallocate


def counting_paths(arena, events: list, on_full, limit: int, counted: dict):
    """:func:`plain_paths` that append ``+nbytes`` to ``events`` for each allocation and ``-nbytes``
    for each free of a block they counted (``counted``: ptr -> nbytes), calling ``on_full()`` when a
    free finds more than ``limit`` events pending."""
    live, lock, states_get, live_pop = arena.live, arena.lock, arena.states.get, arena.live.pop
    record, counted_pop = events.append, counted.pop
    _Stream, _int, _type, _len, _default, _checked = Stream, int, type, len, DEFAULT_ALIGNMENT, checked_free_args
    _AttributeError, _IndexError, _BaseException = AttributeError, IndexError, BaseException

    def free_slow(ptr, nbytes, stream, alignment):
        """A free the lock-free path did not accept (zero, aligned blocks, errors), counted when the
        adaptor counted the block; an error leaves the block counted, as it leaves it live."""
        c = counted_pop(ptr, None)  # forgotten first: once freed, another thread may get ptr again
        try:
            arena.free_slow(ptr, nbytes, stream, alignment)
        except _BaseException:
            if c is not None:
                counted[ptr] = c
            raise
        if c is not None:
            record(-nbytes)
            if _len(events) > limit:
                on_full()

    def allocate(nbytes, stream, alignment=256):
        """Allocate as the arena does, and count it."""
        if _type(stream) is not _Stream:
            stream = arena.as_stream(stream)
        if _type(nbytes) is not _int or nbytes <= 0 or alignment is not _default:
            ptr = arena.allocate_slow(nbytes, stream, alignment)
            if ptr:
                counted[ptr] = n = nbytes.__index__()
                record(n)
            return ptr
        size = (nbytes + 255) & -256
        st = states_get(stream.uid)
        if st is not None:
            try:
                lst = st.cache.get(size)
            except _AttributeError:
                lst = None
            if lst:
                try:
                    ptr = lst.pop()
                except _IndexError:
                    pass
                else:
                    live[ptr] = nbytes
                    counted[ptr] = nbytes
                    record(nbytes)
                    return ptr
        if lock._is_owned():  # a finalizer allocating inside this thread's locked step
            arena.nested_allocation(nbytes)
        with lock:
            ptr = arena.take(size, stream)
            live[ptr] = nbytes
        counted[ptr] = nbytes
        record(nbytes)
        return ptr

    def deallocate(ptr, nbytes, stream, alignment=256):
        """Free as the arena does, and count it (pending events stay within ``limit`` + live blocks)."""
        if _type(stream) is not _Stream:
            stream = arena.as_stream(stream)
        if _type(nbytes) is not _int or alignment is not _default or _type(ptr) is not _int:
            nbytes, alignment = _checked(nbytes, alignment)
            if alignment > 256 or _type(ptr) is not _int:  # see plain_paths
                return free_slow(ptr, nbytes, stream, alignment)
        n = live_pop(ptr, None)
        if n != nbytes:
            if n is not None:
                live[ptr] = n
            return free_slow(ptr, nbytes, stream, alignment)
        if counted_pop(ptr, None) is not None:  # memory the adaptor never counted goes home uncounted
            record(-nbytes)
            if _len(events) > limit:
                on_full()
        size = (nbytes + 255) & -256
        st = states_get(stream.uid)
        if st is not None:
            cache = st.cache
            try:
                lst = cache.get(size)
            except _AttributeError:
                pass
            else:
                if lst is not None:
                    lst.append(ptr)
                    if st.cache is cache:
                        return
                    arena.rescue(lst, size, stream)
                    return
        arena.free_or_defer(ptr, size, stream)

    return allocate, deallocate


def hook_paths(arena, *, current_stream, seen: list, remember, foreign_free):
    """``(malloc(nbytes, device_id), free(ptr, device_id), holds(ptr), None)`` over ``arena`` for
    allocator hooks (``holds``: whether a pointer is one of their live blocks; the compiled build
    puts its ``HookPaths`` object last):

    the caller hands each device its own pair (CuPy's ``Memory`` passes back the device it was made
    with), so the hooks do not check it;
    ``current_stream(device_id)`` gives the caller's current stream object; ``seen`` is a one-element
    list holding ``(weakref to the last stream object, its mrkit Stream)`` and ``remember(obj)``
    converts a stream object and updates ``seen``; ``foreign_free(ptr)`` handles a pointer these hooks
    never handed out. Each live block's stream is remembered until it is freed."""
    live, lock, states_get, live_pop = arena.live, arena.lock, arena.states.get, arena.live.pop
    where: dict[int, Stream] = {}
    where_pop = where.pop
    _int, _type = int, type
    _AttributeError, _IndexError = AttributeError, IndexError

    def malloc(nbytes, device_id):
        """Allocate ``nbytes`` on the caller's current stream of ``device_id`` (the device these hooks
        were made for: the caller dispatches by device, so it is not checked again here)."""
        cs = current_stream(device_id)
        ref, stream = seen[0]
        if ref() is not cs:
            stream = remember(cs)
        if _type(nbytes) is not _int or nbytes <= 0:
            ptr = arena.allocate_slow(nbytes, stream, 256)
            if ptr:
                where[ptr] = stream
            return ptr
        size = (nbytes + 255) & -256
        st = states_get(stream.uid)
        if st is not None:
            try:
                lst = st.cache.get(size)
            except _AttributeError:
                lst = None
            if lst:
                try:
                    ptr = lst.pop()
                except _IndexError:
                    pass
                else:
                    live[ptr] = nbytes
                    where[ptr] = stream
                    return ptr
        if lock._is_owned():  # a finalizer allocating inside this thread's locked step
            arena.nested_allocation(nbytes)
        with lock:
            ptr = arena.take(size, stream)
            live[ptr] = nbytes
        where[ptr] = stream
        return ptr

    def free(ptr, device_id):
        """Free ``ptr`` on the stream it was allocated on."""
        stream = where_pop(ptr, None)
        if stream is None:
            return foreign_free(ptr)
        nbytes = live_pop(ptr, None)
        if nbytes is None:  # cannot happen while ``where`` and ``live`` agree; the lock decides
            arena.free_slow(ptr, -1, stream, 256)
            return
        size = (nbytes + 255) & -256
        st = states_get(stream.uid)
        if st is not None:
            cache = st.cache
            try:
                lst = cache.get(size)
            except _AttributeError:
                pass
            else:
                if lst is not None:
                    lst.append(ptr)
                    if st.cache is cache:
                        return
                    arena.rescue(lst, size, stream)
                    return
        arena.free_or_defer(ptr, size, stream)

    return malloc, free, where.__contains__, None


def rounded_size(size, unit: int) -> int:
    """``size`` (an allocator entry point's argument) rounded up to ``unit``, a power of two:
    ``TypeError``/``ValueError`` naming ``size`` for anything but an int ``>= 0``."""
    return (check_size(size, "size") + unit - 1) & -unit


def route_paths(arena, *, device_id: int, get_device, elsewhere, current_stream, seen: list, remember,
                memory, pointer, unit: int, exiting: list, late: list):
    """``route(size)``: a whole allocator entry point over ``arena`` in one Python frame, for callers
    that take an object from their allocator function and free by dropping it (CuPy's
    ``set_allocator``); the Python build's counterpart of the compiled build's C hooks.

    ``size`` is rounded up to ``unit`` (a power of two, at least the arena's 256) and allocated on the
    caller's current stream (``current_stream``, ``seen``, ``remember`` as in :func:`hook_paths`); the
    result is ``pointer(Block(ptr, n, stream, device_id), 0)``, where ``Block`` is a subclass of
    ``memory`` (CuPy's ``UnownedMemory(ptr, size, owner, device_id)``) whose owner is the block's stream
    and whose finalizer is the free path itself (``n`` the rounded size; ``size == 0`` gives
    ``pointer(memory(0, 0, None, device_id), 0)``; anything but an int ``>= 0`` is a ``TypeError`` or
    ``ValueError`` naming ``size``, :func:`rounded_size`). A block goes back when the last reference
    to its memory object dies (Python runs finalizers before the collector clears a cycle, and ``ptr``
    is not an object field, so a block in a garbage cycle is freed once); no separate owner object is
    made per block. ``get_device()`` names the caller's current
    device (a dispatcher that has read it passes it, ``route(size, device)``); when it is not
    ``device_id`` the call is ``elsewhere(size, device)``'s. While ``exiting[0]`` is true (interpreter
    exit) every free is counted in ``late[0]``, and one that fails in ``late[1]`` instead of being
    reported."""
    if type(unit) is not int or unit < 256 or unit & (unit - 1):
        raise ValueError(f"unit must be a power of two of at least 256 (the arena's size step), not {unit!r}")
    live, lock, states_get, live_pop = arena.live, arena.lock, arena.states.get, arena.live.pop
    _int, _type, _BaseException = int, type, BaseException
    _AttributeError, _IndexError = AttributeError, IndexError
    mask, neg = unit - 1, -unit

    class Block(memory):
        """``memory`` of one block handed out by the route, its owner the stream it was allocated on;
        freed by its finalizer."""

        __slots__ = ()

        def __del__(self):
            ptr, stream = self.ptr, self._owner
            if exiting[0]:
                late[0] += 1
            try:
                nbytes = live_pop(ptr, None)
                if nbytes is None:  # cannot happen while the block is owned; the lock decides
                    arena.free_slow(ptr, -1, stream, 256)
                    return
                st = states_get(stream.uid)  # nbytes: a multiple of the unit, so of the arena's 256
                if st is not None:
                    cache = st.cache
                    try:
                        lst = cache.get(nbytes)
                    except _AttributeError:  # retired
                        pass
                    else:
                        if lst is not None:
                            lst.append(ptr)
                            if st.cache is cache:  # rule 3
                                return
                            arena.rescue(lst, nbytes, stream)
                            return
                arena.free_or_defer(ptr, nbytes, stream)
            except _BaseException:
                if not exiting[0]:
                    raise
                late[1] += 1

    def route(size, dev=None):
        """``size`` bytes (rounded up to the unit) on the caller's current stream, owned by the
        object returned (``dev``: the caller's current device, when the caller has read it already)."""
        if dev is None:
            dev = get_device()
            if dev != device_id:
                return elsewhere(size, dev)
        if _type(size) is _int and size > 0:
            n = (size + mask) & neg
        else:  # zero, other integer types, and every bad size's error
            n = rounded_size(size, unit)
            if n == 0:
                return pointer(memory(0, 0, None, dev), 0)
        cs = current_stream(dev)
        ref, stream = seen[0]
        if ref() is not cs:
            stream = remember(cs)
        st = states_get(stream.uid)
        if st is not None:
            try:
                lst = st.cache.get(n)
            except _AttributeError:
                lst = None
            if lst:
                try:
                    ptr = lst.pop()
                except _IndexError:
                    pass
                else:
                    live[ptr] = n
                    return pointer(Block(ptr, n, stream, dev), 0)
        if lock._is_owned():  # a finalizer allocating inside this thread's locked step
            arena.nested_allocation(n)
        with lock:
            ptr = arena.take(n, stream)
            live[ptr] = n
        return pointer(Block(ptr, n, stream, dev), 0)

    route.rounding = unit
    return route
