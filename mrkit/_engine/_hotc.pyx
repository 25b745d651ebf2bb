# cython: language_level=3, boundscheck=False, wraparound=False, binding=False
# distutils: language = c++
"""The arena's hot path in the compiled build: ``cdef`` classes over one arena's structures.

The same three variants as :mod:`mrkit._engine._hot` (the Python build), step for step, so both builds
keep one semantics: the lock-free part uses only single operations on built-in objects, each done
under the GIL as one C step (``states.get``, a cache list's ``pop``/``append``, ``live[ptr] = n``,
``live.pop(ptr)``); every other step is the arena's own Python code under ``arena.lock``. What the
compiled paths remember between calls (the last stream state, request size and cache list found) is
checked on every use against what it stands for (a state not retired, the same int object, the same
cache dict), so it only ever saves a look-up.

:class:`CHooks` adds allocator hooks callable from C (``void *malloc(void *self, size_t n, int
device)``, ``void free(void *self, void *ptr, int device)``), the signature of CuPy's
``CFunctionAllocator``: no Python object per block, no frame per call.

The locked miss path is compiled too: :class:`FreeList` (the twin of :mod:`mrkit._engine._freelist`:
the same methods and answers, over sorted C arrays searched without branches), :class:`StateFields` (a stream's state as C fields),
:class:`Lock` (its state C fields under the GIL, knowing its owner; waiters sleep on a gate),
:class:`Misses`, :class:`Boundaries` and, in :class:`_Base`, the arena's ``take`` for sources with
the default placement or the plain placement over pages (``ChunkSource.plain_pages``: the VMM without
a footprint limit), the miss count that makes a size hot, and its ``free_block`` (twins of
:class:`~mrkit._engine._arena.Arena`'s, step for step). Anything else (a source's own ``fit`` or
``prepare``, a stream with no state yet, growth, stealing, the out-of-memory reclaim) is the arena's
Python code.
"""
from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF, Py_XDECREF
from cpython.weakref cimport PyWeakref_CheckRef
cimport cython
from libcpp.vector cimport vector
from cpython.list cimport PyList_GET_ITEM
from libc.stdint cimport intptr_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memset

from mrkit._resource import DEFAULT_ALIGNMENT
from mrkit._stream import Stream
from mrkit._engine._hot import checked_free_args, rounded_size as _rounded_size
from time import monotonic as _monotonic
from collections.abc import Mapping as _Mapping, MutableMapping as _MutableMapping

cdef object _Stream = Stream
cdef object _DEFAULT = DEFAULT_ALIGNMENT
cdef object _checked = checked_free_args
_ABSENT = object()  # the default of a required argument: a call leaving it out gets Python's message


cdef object _missing(str where, tuple names, tuple values):
    """The TypeError Python gives a call leaving out required arguments, naming them."""
    left = [f"'{n}'" for n, v in zip(names, values) if v is _ABSENT]
    return TypeError(f"{where}() missing {len(left)} required positional argument{'s' if len(left) > 1 else ''}: "
                     + " and ".join(left))


cdef Py_ssize_t _CACHE_WINDOW = 8  # _arena._CACHE_WINDOW
cdef Py_ssize_t _MAX_HOT = 1024  # _arena.MAX_HOT


cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object obj, int *overflow) except? -1


ctypedef unsigned long long u64


cdef inline Py_ssize_t _bisect(list a, u64 v) except -1:
    """``bisect.bisect_left`` over a sorted list of sizes, compared in C."""
    cdef Py_ssize_t lo = 0, hi = len(a), mid
    cdef u64 m
    while lo < hi:
        mid = (lo + hi) >> 1
        m = a[mid]
        if m < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline bint _as_u64(object x, u64 *out) except -1:
    """``x`` as an unsigned 64-bit value; false (nothing set) when it is negative or does not fit."""
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(x, &overflow)
    if overflow > 0:
        if x >= (1 << 64):
            return 0
        out[0] = <u64>x
        return 1
    if overflow < 0 or v < 0:
        return 0
    out[0] = <u64>v
    return 1


cdef extern from *:
    """
    /* Pop the last item of a list without shrinking its storage (list.pop gives it back when the
       list empties, and grows it again at the next append: two reallocations per cache hit and
       free on a list that holds one block). The list's reference becomes the caller's; None when
       the list is empty (a cache list holds ints only). The GIL is held: no other thread runs. */
    static inline PyObject *mrkit_list_pop_keep(PyObject *lst) {
        Py_ssize_t n = PyList_GET_SIZE(lst);
        if (n == 0) {
            Py_INCREF(Py_None);
            return Py_None;
        }
        PyObject *item = PyList_GET_ITEM(lst, n - 1);
        Py_SET_SIZE(lst, n - 1);
        return item;
    }
    """
    object _pop_keep "mrkit_list_pop_keep"(list lst)


cdef extern from "_freetree.h":
    ctypedef struct MkKey:
        u64 hi
        u64 lo
    ctypedef struct MkPos:
        size_t i
        size_t j
    cdef cppclass MkSorted:
        size_t size()
        bint valid(const MkPos &p)
        const MkKey &at(const MkPos &p)
    cdef cppclass MkFreeList:
        u64 free_bytes
        size_t count()
        void add(u64 ptr, u64 size) except +
        bint remove(u64 ptr, u64 size)
        void neighbours(u64 ptr, u64 size, bint *has_prev, MkKey *prev, bint *has_next, u64 *next_size)
        void insert(u64 ptr, u64 size, bint has_prev, MkKey prev, bint has_next, u64 nsize) except +
        MkPos best(u64 n)
        u64 cut_at(const MkPos &p, u64 n) except +
        bint take(u64 n, bint has_spare, u64 spare, u64 *out) except +
        bint size_at(u64 ptr, u64 *out)
        bint ending_at(u64 e, u64 *out)
        bint cut(u64 block, u64 at, u64 n) except +
        void candidates(u64 n, size_t k, vector[MkKey] &out) except +
        void blocks(vector[MkKey] &out) except +
        void items(vector[MkKey] &out) except +
        u64 largest()
        const MkSorted &sizes()
    size_t mk_lower_u64(const u64 *a, size_t n, u64 k)
    cdef cppclass MkBounds:
        bint has(u64 b)
        void add(u64 b) except +
        void discard(u64 b)
        size_t size()
        u64 get(size_t i)


cdef class FreeList:
    """The compiled twin of :class:`mrkit._engine._freelist.FreeList`: the same methods and answers,
    over two sorted indexes of C values (``_freetree.h``): by ``(size, ptr)`` (best fit, the lowest
    address first among one size, is one search) and by ``(start, size)`` (one search finds both
    neighbours of a block being freed). Each index is a sorted array in leaves of 64 keys, searched
    without branches: a red-black tree's walk mispredicts about half its branches on random sizes.
    No Python object per free block. Touched only under its arena's lock."""
    cdef MkFreeList fl

    def __len__(self):
        return self.fl.count()

    cdef int insert_c(self, u64 ptr, u64 size, object boundaries) except -1:
        """Add a block, coalescing it with its free neighbours (never across a boundary)."""
        cdef bint has_prev, has_next
        cdef MkKey prev
        cdef u64 nsize = 0
        self.fl.neighbours(ptr, size, &has_prev, &prev, &has_next, &nsize)
        if has_prev and _boundary(boundaries, ptr):
            has_prev = False
        if has_next and _boundary(boundaries, ptr + size):
            has_next = False
        self.fl.insert(ptr, size, has_prev, prev, has_next, nsize)
        return 0

    cdef bint take_u(self, u64 size, bint has_spare, u64 sp, u64 *out) except -1:
        """:meth:`take` in C values: true and the start of the block in ``out``, else false."""
        return self.fl.take(size, has_spare, sp, out)

    cdef inline MkPos best_c(self, u64 size):
        """Where best fit for ``size`` would cut (not :meth:`is_best`: nothing fits)."""
        return self.fl.best(size)

    cdef inline bint is_best(self, const MkPos &p):
        return self.fl.sizes().valid(p)

    cdef inline u64 size_of_best(self, const MkPos &p):
        return self.fl.sizes().at(p).hi

    cdef inline u64 cut_at(self, const MkPos &p, u64 size) except? 0:
        """Take ``size`` bytes from the start of the free block at ``p`` (which holds them); its start."""
        return self.fl.cut_at(p, size)

    def add(self, ptr, size):
        """Add a block without coalescing."""
        self.fl.add(ptr, size)

    def remove(self, ptr, size):
        """Remove the free block ``[ptr, ptr + size)`` (it must be one: else KeyError)."""
        cdef u64 p, n
        if not _as_u64(ptr, &p) or not _as_u64(size, &n) or not self.fl.remove(p, n):
            raise KeyError(ptr)

    def insert(self, ptr, size, boundaries):
        """Add a block, coalescing it with free neighbours on both sides (never across a boundary)."""
        self.insert_c(ptr, size, boundaries)

    def insert_drained(self, list ptrs not None, size, boundaries):
        """Pop every block of ``size`` out of ``ptrs`` (a cache list) and insert each (coalescing): in
        C, so no other thread runs in between and each block is taken by exactly one party."""
        cdef u64 n = size
        while ptrs:
            self.insert_c(_pop_keep(ptrs), n, boundaries)

    def take(self, size, spare=None):
        """Best fit: cut ``size`` bytes from a block of the smallest size that holds them; the block at
        ``spare`` only when nothing else fits. None when nothing fits."""
        cdef u64 n, sp = 0, ptr
        if not _as_u64(size, &n):
            return None
        if not self.take_u(n, spare is not None and _as_u64(spare, &sp), sp, &ptr):
            return None
        return ptr

    def fits(self, size):
        """The smallest free size that holds ``size``, or None."""
        cdef u64 n
        if not _as_u64(size, &n):
            return None
        cdef MkPos p = self.best_c(n)
        return self.size_of_best(p) if self.is_best(p) else None

    def cut(self, block, at, size):
        """Take ``[at, at + size)`` out of the free block that starts at ``block``; the rest stays
        free. Returns ``at + size``."""
        cdef u64 b = block, a = at, n = size
        if not self.fl.cut(b, a, n):
            raise KeyError(block)
        return a + n

    def candidates(self, size, n):
        """Up to ``n`` blocks ``(size, ptr)`` that hold ``size``, best fit first."""
        cdef u64 s
        cdef vector[MkKey] got  # copied out first: making the tuples may run the collector
        if not _as_u64(size, &s) or n <= 0:
            return []
        self.fl.candidates(s, <size_t>n, got)
        return [(e.hi, e.lo) for e in got]

    def blocks(self):
        """Every free block as ``(size, ptr)``, smallest first, lowest address first within a size."""
        cdef vector[MkKey] got
        self.fl.blocks(got)
        return [(e.hi, e.lo) for e in got]

    def items(self):
        """Every free block as ``(ptr, size)``, lowest address first."""
        cdef vector[MkKey] got
        self.fl.items(got)
        return [(e.hi, e.lo) for e in got]

    def size_at(self, ptr):
        """The size of the free block that starts at ``ptr``, or None."""
        cdef u64 p, n
        if not _as_u64(ptr, &p) or not self.fl.size_at(p, &n):
            return None
        return n

    cdef inline bint ending_at_u(self, u64 e, u64 *out):
        """Whether a free block ends at ``e`` (its start in ``out``)."""
        return self.fl.ending_at(e, out)

    def ending_at(self, end):
        """The start of the free block that ends at ``end``, or None."""
        cdef u64 e, p
        if not _as_u64(end, &e) or not self.ending_at_u(e, &p):
            return None
        return p

    def absorb(self, FreeList other, boundaries):
        """Merge ``other`` into whichever of the two is larger and return that one."""
        big, small = (self, other) if self.fl.count() >= other.fl.count() else (other, self)
        for ptr, size in small.items():
            (<FreeList>big).insert_c(ptr, size, boundaries)
        return big

    def largest(self):
        return self.fl.largest()

    def total(self):
        return self.fl.free_bytes


cdef class Boundaries:
    """The compiled twin of the Python build's ``set`` of chunk bases (blocks never coalesce across
    one): a sorted C array (``_freetree.h``), asked in C by :meth:`FreeList.insert` without making a
    Python int; from Python, the set methods the engine uses (``add``, ``discard``, ``in``, ``len``,
    iteration)."""
    cdef MkBounds bases

    def __init__(self, iterable=()):
        for b in iterable:
            self.add(b)

    cdef inline bint has(self, u64 b):
        return self.bases.has(b)

    def add(self, b):
        self.bases.add(<u64>b)

    def discard(self, b):
        cdef u64 v
        if _as_u64(b, &v):
            self.bases.discard(v)

    def __contains__(self, b):
        cdef u64 v
        return _as_u64(b, &v) and self.has(v)

    def __len__(self):
        return self.bases.size()

    def __iter__(self):
        cdef size_t i
        return iter([self.bases.get(i) for i in range(self.bases.size())])

    def __repr__(self):
        return f"Boundaries({sorted(self)!r})"


cdef inline bint _boundary(object boundaries, u64 b) except -1:
    """Whether ``b`` is in ``boundaries`` (a :class:`Boundaries`, or any container: a test's set)."""
    if type(boundaries) is Boundaries:
        return (<Boundaries>boundaries).has(b)
    return b in boundaries


cdef class StateFields:
    """A stream's state in the compiled build: the fields of ``_arena.StreamState`` as C struct fields
    (the arena's state class adds its methods), read here without an attribute lookup."""
    cdef public object stream
    cdef public object cache  # a dict; None once retired (a test may put a dict subclass here)
    cdef public list hot
    cdef public FreeList free
    cdef public set rehot
    # Whether a block may be in the cache: set by every append to a cache list (in the same C step,
    # under the GIL), cleared by a walk that finds none; a miss then skips the walk (cached_c).
    cdef public bint maybe_cached
    # The compiled index of the cache for a miss's look at the hot sizes (_Base.take_cached): ``hot``
    # as C values and each size's cache list, in ``hot``'s order, with no dict look-up. It stands for
    # the cache dict ``index_cache`` when ``hot`` had ``index_len`` sizes: only the lock changes the
    # sizes (register adds one to ``hot`` and to the dict; a flush or a retire replaces the dict), so
    # while both still hold, the index is the cache's (else it is made again, under the lock).
    cdef vector[u64] hot_sizes
    cdef list hot_lists
    cdef object index_cache
    cdef Py_ssize_t index_len
    # The same index by size for the lock-free look-ups (list_for): a flat hash table, size -> its
    # list (borrowed: ``hot_lists`` holds each), at most half full; no slot is ever emptied (sizes
    # only join an index; a new index is a new table).
    cdef u64 *by_size  # 0: an empty slot (no cache size is 0)
    cdef PyObject **lists
    cdef Py_ssize_t slots

    def __init__(self, stream, FreeList free not None):
        self.stream, self.cache, self.hot, self.free, self.rehot = stream, {}, [], free, set()
        self.index_len = -1

    def __dealloc__(self):
        free(self.by_size)
        free(self.lists)

    cdef int rehash(self, Py_ssize_t want) except -1:
        """The hash table made again from ``hot_sizes`` and ``hot_lists``, with room for ``want``
        sizes (lock held; C only, so a lock-free reader sees the old table or the new one)."""
        cdef Py_ssize_t n = 16, i
        while n < 2 * want:
            n <<= 1
        cdef u64 *keys = <u64*>calloc(n, sizeof(u64))
        cdef PyObject **lists = <PyObject**>calloc(n, sizeof(PyObject*))
        if keys is NULL or lists is NULL:
            free(keys)
            free(lists)
            raise MemoryError()
        free(self.by_size)
        free(self.lists)
        self.by_size, self.lists, self.slots = keys, lists, n
        for i in range(<Py_ssize_t>self.hot_sizes.size()):
            self.hash_add(self.hot_sizes[i], PyList_GET_ITEM(self.hot_lists, i))
        return 0

    cdef inline void hash_add(self, u64 size, PyObject *lst) noexcept:
        cdef Py_ssize_t mask = self.slots - 1
        cdef Py_ssize_t i = <Py_ssize_t>((size * 0x9E3779B97F4A7C15ULL) >> 40) & mask
        while self.by_size[i] != 0 and self.by_size[i] != size:
            i = (i + 1) & mask
        self.by_size[i], self.lists[i] = size, lst

    cdef int index_add(self, Py_ssize_t i, u64 size, list lst) except -1:
        """``size`` joins the index at position ``i`` of the sorted sizes (lock held)."""
        self.hot_sizes.insert(self.hot_sizes.begin() + i, size)
        self.hot_lists.insert(i, lst)
        if 2 * <Py_ssize_t>self.hot_sizes.size() > self.slots:
            self.rehash(self.hot_sizes.size())
        else:
            self.hash_add(size, <PyObject*>lst)
        self.index_len += 1
        return 0

    cdef inline bint indexed(self):
        """Whether the index is the cache's (lock held)."""
        return self.index_cache is self.cache and self.index_len == len(self.hot)

    cdef int reindex(self) except -1:
        """Make the index from ``hot`` and the cache (lock held)."""
        cdef dict cache = <dict>self.cache
        cdef list hot = self.hot, lists = []
        self.index_len = -1
        self.hot_sizes.clear()
        for size in hot:
            self.hot_sizes.push_back(<u64>size)
            lists.append(cache[size])
        self.hot_lists = lists
        self.rehash(len(hot) + 16)
        self.index_cache, self.index_len = cache, len(hot)
        return 0

    cdef inline object list_for(self, u64 size):
        """The cache list of ``size`` through the index (only while :meth:`indexed` holds; lock-free:
        the index changes only in C steps under the lock), or None when ``size`` has none: one probe
        of a flat table, most often, no int made, no dict probed."""
        cdef Py_ssize_t mask = self.slots - 1
        cdef Py_ssize_t i = <Py_ssize_t>((size * 0x9E3779B97F4A7C15ULL) >> 40) & mask
        cdef u64 at
        while True:
            at = self.by_size[i]
            if at == size:
                return <object>self.lists[i]
            if at == 0:
                return None
            i = (i + 1) & mask

    cdef bint cached_c(self) except -1:
        cdef Py_ssize_t pos = 0
        cdef PyObject *key
        cdef PyObject *value
        if not self.maybe_cached:
            return False
        cache = self.cache
        if not cache:
            return False
        while PyDict_Next(cache, &pos, &key, &value):  # only the lock adds keys
            if <object>value:
                return True
        self.maybe_cached = False  # the walk runs no Python code: no append came in between
        return False

    def cached(self):
        """Whether any block is in the cache (lock held): ``StreamState.cached``, the values walked in
        C (the VMM's placement asks on every miss)."""
        return self.cached_c()


cdef extern from "pythread.h":
    ctypedef void *PyThread_type_lock
    ctypedef enum PyLockStatus:
        PY_LOCK_FAILURE, PY_LOCK_ACQUIRED, PY_LOCK_INTR
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock lock)
    int PyThread_acquire_lock(PyThread_type_lock lock, int waitflag) nogil
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock lock, long long microseconds,
                                             int intr_flag) nogil
    void PyThread_release_lock(PyThread_type_lock lock) nogil


cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident() nogil


cdef class Lock:
    """An arena's lock in the compiled build. Its state (held, owner, depth, waiters) is C fields read
    and written only with the GIL held, so taking a free lock and giving it back are a few C stores:
    no call into the operating system and no clock read (CPython's own lock reads the monotonic clock on
    every acquire, even a non-blocking one). A thread that finds it held waits, without the GIL, on a
    gate (a CPython lock, closed while no wakeup is pending): every give while a thread waits opens it,
    and a woken thread takes the lock if it is free, else waits again (no wakeup is lost: a waiter
    counts itself before it sleeps, and whoever holds the lock then opens the gate when giving it).

    The compiled paths take it in C and learn when the calling thread holds it already (:meth:`take`);
    from Python it is a ``threading.RLock`` (``acquire(blocking, timeout)``, ``release``, ``with``, and
    ``_is_owned`` as the Python build's lock has it). A wait is not interrupted by signals."""
    cdef PyThread_type_lock gate  # closed (acquired) while no give is pending for a waiter
    cdef bint held
    cdef unsigned long owner  # the holder's thread ident, set while held
    cdef Py_ssize_t depth  # acquisitions by the holder (Python's acquire is reentrant)
    cdef Py_ssize_t waiters  # threads waiting on the gate

    def __cinit__(self):
        self.gate = PyThread_allocate_lock()
        if self.gate is NULL:
            raise MemoryError("could not allocate a lock")
        PyThread_acquire_lock(self.gate, 1)

    def __dealloc__(self):
        if self.gate is not NULL:
            PyThread_acquire_lock(self.gate, 0)  # closed, whether a give had opened it or not,
            PyThread_release_lock(self.gate)     # then freed unlocked
            PyThread_free_lock(self.gate)

    cdef inline bint mine(self):
        return self.held and self.owner == PyThread_get_thread_ident()

    cdef inline void grab(self):
        self.held, self.owner, self.depth = True, PyThread_get_thread_ident(), 1

    cdef bint wait(self, long long us) except -1:
        """Wait until the lock is free and take it (GIL held on entry and return); ``us`` >= 0: give up
        after that many microseconds (false)."""
        cdef double deadline = 0, left
        if us >= 0:
            deadline = _monotonic() + us * 1e-6
        self.waiters += 1
        try:
            while self.held:
                if us < 0:
                    with nogil:
                        PyThread_acquire_lock(self.gate, 1)
                else:
                    left = deadline - _monotonic()
                    if left <= 0:
                        return False
                    with nogil:
                        PyThread_acquire_lock_timed(self.gate, <long long>(left * 1e6), 0)
        finally:
            self.waiters -= 1
        self.grab()
        return True

    cdef inline bint take(self) except -1:
        """Take the lock (waiting without the GIL): true; false, taking nothing, when the calling
        thread holds it already (a finalizer run inside one of its locked steps)."""
        if not self.held:
            self.grab()
            return True
        if self.owner == PyThread_get_thread_ident():
            return False
        return self.wait(-1)

    cdef inline bint try_take(self):
        """Take the lock if it is free: true; false, taking nothing, when any thread holds it."""
        if self.held:
            return False
        self.grab()
        return True

    cdef inline void give(self):
        self.held, self.depth, self.owner = False, 0, 0
        if self.waiters:  # wake one waiter: the gate opened exactly once, whether it was open or not
            PyThread_acquire_lock(self.gate, 0)  # (releasing an open lock is not defined everywhere)
            PyThread_release_lock(self.gate)

    def acquire(self, blocking=True, timeout=-1):
        """Take the lock (``threading.RLock.acquire``'s arguments); whether it was taken."""
        if not blocking and timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        if blocking and timeout != -1 and timeout < 0:
            raise ValueError("timeout value must be a non-negative number")
        if self.mine():
            self.depth += 1
            return True
        if not self.held:
            self.grab()
            return True
        if not blocking:
            return False
        return self.wait(-1 if timeout == -1 else <long long>(timeout * 1e6))

    def release(self):
        if not self.mine():
            raise RuntimeError("cannot release un-acquired lock")
        if self.depth > 1:
            self.depth -= 1
        else:
            self.give()

    def _is_owned(self):
        """Whether the calling thread holds the lock."""
        return self.mine()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"<mrkit lock {'locked' if self.held else 'unlocked'}>"


cdef class Misses:
    """The compiled twin of ``_hot.Misses`` (``small``, ``small_distance`` as there): the sizes that
    missed the cache lately, in a flat hash table (open addressing, at most half full; no Python int
    kept per size, no allocation per size, emptied at once by moving to a new generation), the counter
    a C field (touched only under the arena's lock)."""
    cdef u64 *keys
    cdef Py_ssize_t *counts
    cdef Py_ssize_t *runs  # how many times in a row the size missed again within the distance
    cdef unsigned int *gens  # a slot holds an entry when its generation is the table's
    cdef unsigned int gen
    cdef Py_ssize_t mask, used
    cdef readonly Py_ssize_t count, distance, capacity, repeats, small_distance
    cdef readonly u64 small

    def __cinit__(self, Py_ssize_t distance, Py_ssize_t capacity, Py_ssize_t repeats=1, long long small=0,
                  Py_ssize_t small_distance=0):
        cdef Py_ssize_t n = 16
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        if small < 0 or small_distance < 0:
            raise ValueError(f"small and small_distance must be >= 0, got {small} and {small_distance}")
        self.small, self.small_distance = <u64>small, small_distance
        while n < 2 * capacity:
            n <<= 1
        self.keys = <u64*>calloc(n, sizeof(u64))
        self.counts = <Py_ssize_t*>calloc(n, sizeof(Py_ssize_t))
        self.runs = <Py_ssize_t*>calloc(n, sizeof(Py_ssize_t))
        self.gens = <unsigned int*>calloc(n, sizeof(unsigned int))
        if self.keys is NULL or self.counts is NULL or self.runs is NULL or self.gens is NULL:
            raise MemoryError()
        self.mask, self.gen = n - 1, 1
        self.distance, self.capacity, self.repeats = distance, capacity, repeats

    def __dealloc__(self):
        free(self.keys)
        free(self.counts)
        free(self.runs)
        free(self.gens)

    cdef inline Py_ssize_t slot(self, u64 size):
        """The slot that holds ``size``, else the empty slot where it would go."""
        cdef Py_ssize_t i = <Py_ssize_t>((size * 0x9E3779B97F4A7C15ULL) >> 32) & self.mask
        while self.gens[i] == self.gen and self.keys[i] != size:
            i = (i + 1) & self.mask
        return i

    cdef bint note_c(self, u64 size):
        self.count += 1
        cdef Py_ssize_t i = self.slot(size)
        cdef bint found = self.gens[i] == self.gen
        cdef bint again = found and self.count - self.counts[i] <= (
            self.small_distance if size <= self.small else self.distance)
        if again or (found and self.used < self.capacity):
            self.counts[i] = self.count
            self.runs[i] = self.runs[i] + 1 if again else 0
            return again and self.runs[i] >= self.repeats
        if self.used >= self.capacity:  # full: start afresh
            self.gen += 1
            if self.gen == 0:  # the generations wrapped: every slot empty for real
                memset(self.gens, 0, (self.mask + 1) * sizeof(unsigned int))
                self.gen = 1
            self.used = 0
            i = self.slot(size)
        self.keys[i], self.counts[i], self.runs[i], self.gens[i] = size, self.count, 0, self.gen
        self.used += 1
        return False

    def note(self, size):
        """Count a miss of ``size``; whether it missed again within ``distance`` misses of its last
        miss for the ``repeats``-th time in a row."""
        return self.note_c(size)

    @property
    def last(self):
        """``size -> the count at its last miss``, as a new dict."""
        cdef Py_ssize_t i
        return {self.keys[i]: self.counts[i] for i in range(self.mask + 1) if self.gens[i] == self.gen}


cdef extern from "Python.h":
    object PyNumber_Index(object o)
    bint PyIndex_Check(object o)

cdef u64 _NO_KEY = 0xFFFFFFFFFFFFFFFFULL  # an empty slot (no block ends past the last address)
cdef object _MISSING = object()


cdef inline bint _key_of(object k, u64 *out) except -1:
    """``k`` as a block address (an int, or an object with ``__index__``, as a dict finds an equal int);
    false for anything else, a negative value or one that cannot be an address."""
    if not isinstance(k, int):
        if not PyIndex_Check(k):
            return 0
        k = PyNumber_Index(k)
    return _as_u64(k, out) and out[0] != _NO_KEY


cdef class AddressTable:
    """The compiled build's table of block addresses: a ``dict`` of address -> size (the arena's
    ``live``: ints in ``[0, 2**64)``) or, made with ``objects=True``, address -> object (the hooks'
    ``where``: each block's stream).

    Block addresses are multiples of 256, which CPython's int hash crowds into a handful of first
    slots of a dict (a look-up then compares several keys, each a separate int object). Here the keys
    are C values in one flat array: open addressing by a multiplicative hash, linear probing, at most
    half full, deletion by backward shift (no tombstones), large storage (over 32 768 slots) halved
    when a sixteenth of it would do. Each operation is one C step under the GIL (no Python code runs inside), as a dict's is, so
    the engine's lock-free steps keep their meaning; the Python view (``keys``, ``values``, ``items``,
    ``copy``, iteration) copies the entries out first, then makes the objects (making them may run
    the collector, and a finalizer may free a block)."""
    cdef u64 *addr  # each slot's address, or _NO_KEY
    cdef u64 *size  # each slot's size (objects=False), else NULL
    cdef PyObject **obj  # each slot's object (objects=True), else NULL
    cdef Py_ssize_t mask, used
    cdef int shift
    cdef readonly bint objects

    def __cinit__(self, bint objects=False):
        self.objects = objects
        if self.alloc(16) < 0:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.obj is not NULL:
            for i in range(self.mask + 1):
                if self.addr[i] != _NO_KEY:
                    Py_XDECREF(self.obj[i])
        free(self.addr)
        free(self.size)
        free(self.obj)

    cdef int alloc(self, Py_ssize_t n) noexcept:
        """Empty storage of ``n`` slots (a power of two); -1 when memory runs out (nothing changed)."""
        cdef u64 *keys = <u64*>malloc(n * sizeof(u64))
        cdef u64 *vals = NULL
        cdef PyObject **objs = NULL
        cdef Py_ssize_t i
        if self.objects:
            objs = <PyObject**>malloc(n * sizeof(PyObject*))
        else:
            vals = <u64*>malloc(n * sizeof(u64))
        if keys is NULL or (vals is NULL and objs is NULL):
            free(keys)
            free(vals)
            free(objs)
            return -1
        for i in range(n):
            keys[i] = _NO_KEY
        self.addr, self.size, self.obj = keys, vals, objs
        self.mask, self.used = n - 1, 0
        self.shift = 64
        while n > 1:
            n >>= 1
            self.shift -= 1
        return 0

    cdef inline Py_ssize_t home(self, u64 k) noexcept:
        return <Py_ssize_t>((k * 0x9E3779B97F4A7C15ULL) >> self.shift)  # the top bits: every bit counts

    cdef inline Py_ssize_t find(self, u64 k) noexcept:
        """The slot holding ``k``, or -1."""
        cdef Py_ssize_t i = self.home(k)
        cdef u64 at
        while True:
            at = self.addr[i]
            if at == k:
                return i
            if at == _NO_KEY:
                return -1
            i = (i + 1) & self.mask

    cdef int resize(self, Py_ssize_t n) except -1:
        """Move every entry into ``n`` slots."""
        cdef u64 *keys = self.addr
        cdef u64 *vals = self.size
        cdef PyObject **objs = self.obj
        cdef Py_ssize_t old = self.mask + 1, used = self.used, i, j
        if self.alloc(n) < 0:
            raise MemoryError()
        for i in range(old):
            if keys[i] != _NO_KEY:
                j = self.home(keys[i])
                while self.addr[j] != _NO_KEY:
                    j = (j + 1) & self.mask
                self.addr[j] = keys[i]
                if objs is NULL:
                    self.size[j] = vals[i]
                else:
                    self.obj[j] = objs[i]
        self.used = used
        free(keys)
        free(vals)
        free(objs)
        return 0

    cdef inline Py_ssize_t slot_for(self, u64 k) except -2:
        """The slot for a new or existing ``k`` (grown first if a new entry would fill half)."""
        cdef Py_ssize_t i
        if 2 * (self.used + 1) > self.mask + 1:
            i = self.find(k)
            if i >= 0:
                return i
            self.resize(2 * (self.mask + 1))
        i = self.home(k)
        while self.addr[i] != _NO_KEY and self.addr[i] != k:
            i = (i + 1) & self.mask
        return i

    cdef void remove_at(self, Py_ssize_t i) noexcept:
        """Empty slot ``i`` (its object's reference already taken), shifting later entries of the
        run back so that every look-up still finds them."""
        cdef Py_ssize_t j = i, h
        while True:
            j = (j + 1) & self.mask
            if self.addr[j] == _NO_KEY:
                break
            h = self.home(self.addr[j])
            if (i <= j and i < h <= j) or (i > j and (h > i or h <= j)):
                continue  # at or after its home: stays
            self.addr[i] = self.addr[j]
            if self.obj is NULL:
                self.size[i] = self.size[j]
            else:
                self.obj[i] = self.obj[j]
            i = j
        self.addr[i] = _NO_KEY
        self.used -= 1

    cdef inline void shrink(self) noexcept:
        """Halve large storage (more than 32 768 slots) while a sixteenth of it would do (a failed
        allocation keeps it); smaller storage stays, as a dict's does, so that a batch made and freed
        again and again does not resize the table each time."""
        if 16 * self.used < self.mask + 1 and self.mask >= 65535:
            try:
                self.resize((self.mask + 1) // 2)
            except MemoryError:
                pass

    # -- the engine's C steps -------------------------------------------------------------------
    cdef inline int put_u(self, u64 k, u64 v) except -1:
        cdef Py_ssize_t i = self.slot_for(k)
        if self.addr[i] == _NO_KEY:
            self.addr[i] = k
            self.used += 1
        self.size[i] = v
        return 0

    cdef inline bint take_u(self, u64 k, u64 *v) noexcept:
        """Remove ``k``, its size in ``v``; false (nothing changed) when absent."""
        cdef Py_ssize_t i = self.find(k)
        if i < 0:
            return 0
        v[0] = self.size[i]
        self.remove_at(i)
        self.shrink()
        return 1

    cdef inline int put(self, object ptr, object nbytes) except -1:
        """``live[ptr] = nbytes`` for an address and a size the engine made or checked."""
        cdef u64 k, v
        if not _key_of(ptr, &k):
            raise TypeError(f"a block address must be an int in [0, 2**64 - 1), not {ptr!r}")
        if not isinstance(nbytes, int):
            raise TypeError(f"a size must be an int, not {type(nbytes).__name__}")
        if not _as_u64(nbytes, &v):
            raise ValueError(f"a size must be an int in [0, 2**64), not {nbytes!r}")
        return self.put_u(k, v)

    cdef inline int put_obj(self, u64 k, object o) except -1:
        cdef Py_ssize_t i = self.slot_for(k)
        Py_INCREF(o)
        if self.addr[i] == _NO_KEY:
            self.addr[i] = k
            self.used += 1
        else:
            Py_XDECREF(self.obj[i])
        self.obj[i] = <PyObject*>o
        return 0

    cdef inline object take_obj(self, u64 k):
        """Remove ``k``; its object (the table's reference, now the caller's), or None when absent."""
        cdef Py_ssize_t i = self.find(k)
        cdef PyObject *o
        if i < 0:
            return None
        o = self.obj[i]
        self.remove_at(i)
        self.shrink()
        r = <object>o  # a new reference...
        Py_DECREF(r)  # ...and the table's given up
        return r

    # -- the mapping --------------------------------------------------------------------------------
    @property
    def capacity(self):
        """How many slots the storage has now (a power of two, at least twice the entries)."""
        return self.mask + 1

    cdef object value_at(self, Py_ssize_t i):
        if self.obj is NULL:
            return self.size[i]
        return <object>self.obj[i]

    def __len__(self):
        return self.used

    def __contains__(self, key):
        cdef u64 k
        return _key_of(key, &k) and self.find(k) >= 0

    def __getitem__(self, key):
        cdef u64 k
        cdef Py_ssize_t i = self.find(k) if _key_of(key, &k) else -1
        if i < 0:
            raise KeyError(key)
        return self.value_at(i)

    def get(self, key, default=None):
        cdef u64 k
        cdef Py_ssize_t i = self.find(k) if _key_of(key, &k) else -1
        return default if i < 0 else self.value_at(i)

    def __setitem__(self, key, value):
        cdef u64 k
        if not self.objects:
            self.put(key, value)
            return
        if not _key_of(key, &k):
            raise TypeError(f"a block address must be an int in [0, 2**64 - 1), not {key!r}")
        self.put_obj(k, value)

    def __delitem__(self, key):
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key, default=_MISSING):
        cdef u64 k, v
        if _key_of(key, &k):
            if self.obj is not NULL:
                if self.find(k) >= 0:
                    return self.take_obj(k)
            elif self.take_u(k, &v):
                return v
        if default is _MISSING:
            raise KeyError(key)
        return default

    def clear(self):
        cdef Py_ssize_t i
        cdef list dropped = []
        if self.obj is not NULL:
            for i in range(self.mask + 1):
                if self.addr[i] != _NO_KEY:
                    dropped.append(<object>self.obj[i])
                    Py_DECREF(<object>self.obj[i])
        for i in range(self.mask + 1):
            self.addr[i] = _NO_KEY
        self.used = 0
        del dropped  # the objects released after the table is consistent

    cdef list entries(self, int what):
        """The keys (0), values (1) or ``(key, value)`` pairs (2), copied out before any object is
        made."""
        cdef vector[u64] ks, vs
        cdef vector[PyObject*] ps  # each held (a reference taken) until the lists are made
        cdef Py_ssize_t i, n
        for i in range(self.mask + 1):
            if self.addr[i] != _NO_KEY:
                ks.push_back(self.addr[i])
                if self.obj is NULL:
                    vs.push_back(self.size[i])
                else:
                    Py_INCREF(<object>self.obj[i])
                    ps.push_back(self.obj[i])
        n = ks.size()
        try:
            if what == 0:
                return [ks[i] for i in range(n)]
            if self.objects:
                if what == 1:
                    return [<object>ps[i] for i in range(n)]
                return [(ks[i], <object>ps[i]) for i in range(n)]
            if what == 1:
                return [vs[i] for i in range(n)]
            return [(ks[i], vs[i]) for i in range(n)]
        finally:
            for i in range(<Py_ssize_t>ps.size()):
                Py_DECREF(<object>ps[i])

    def keys(self):
        """The addresses, as a new list."""
        return self.entries(0)

    def values(self):
        """The values, as a new list."""
        return self.entries(1)

    def items(self):
        """``(address, value)`` pairs, as a new list."""
        return self.entries(2)

    def __iter__(self):
        return iter(self.entries(0))

    def copy(self):
        """The entries as a new ``dict``."""
        return dict(self.entries(2))

    def __eq__(self, other):
        if isinstance(other, AddressTable):
            other = (<AddressTable>other).copy()
        elif not isinstance(other, _Mapping):
            return NotImplemented
        return self.copy() == dict(other)

    __hash__ = None

    def __repr__(self):
        return f"AddressTable({self.copy()!r})"


_MutableMapping.register(AddressTable)


cdef class _Base:
    """What every variant reads: the arena's live table, states, lock and locked steps."""
    cdef AddressTable live
    cdef object states, states_get
    cdef Lock lock
    cdef Misses missed
    cdef list deferred
    cdef bint ordered
    cdef object take, to_stream, allocate_slow, arena_free_slow, rescue, free_block
    cdef object arena, find, boundaries, fit, prepare, source
    cdef bint default_fit
    cdef dict aligned
    cdef bint pages_fit  # the source's placement is the plain one over pages (ChunkSource.plain_pages)
    cdef list cov_starts
    cdef dict cov_end
    cdef u64 base, page
    cdef StateFields last_state  # see state_of
    cdef object memo_n, memo_size  # the last request seen and its cache size (see size_of)
    cdef object memo_cache, memo_list  # the last cache list found, for the size memo_usize (see list_u)
    cdef u64 memo_usize

    def __init__(self, arena):
        self.arena, self.find, self.boundaries = arena, arena.find, arena.boundaries
        self.default_fit = arena.default_fit  # the placement compiled here, else the source's own
        self.fit, self.prepare = arena.source.fit, arena._prepare
        self.source, self.aligned = arena.source, arena.aligned
        pages = arena.source.plain_pages()
        self.pages_fit = pages is not None and self.prepare is not None
        if self.pages_fit:
            cov, self.base, self.page = pages
            self.cov_starts, self.cov_end = cov.starts, cov.end
        self.live = arena.live
        self.states = arena.states
        self.ordered = type(arena.states) is dict  # else one state for every stream (its own get)
        self.states_get = arena.states.get
        self.lock = arena.lock  # the build's Lock (the arena makes it)
        self.missed = arena.missed
        self.deferred = arena.deferred
        self.take, self.to_stream = arena.take, arena.as_stream
        self.allocate_slow, self.arena_free_slow = arena.allocate_slow, arena.free_slow
        self.rescue, self.free_block = arena.rescue, arena.free_block

    cdef inline StateFields state_of(self, object stream):
        """The stream's state, or None (the arena makes every state of the compiled build's class).

        The state found last is kept: asked again for the very stream object it was made for, and
        not retired (a state leaves the table only retired, its ``cache`` None for good: rule 4), it
        is the table's answer without a look-up."""
        cdef StateFields last = self.last_state
        if last is not None and last.stream is stream and last.cache is not None:
            return last
        if self.ordered:
            st = (<dict>self.states).get(stream.uid)
        else:
            st = self.states_get(stream.uid)
        if st is None:
            return None
        self.last_state = <StateFields>st
        return <StateFields>st

    cdef inline object size_of(self, object nbytes):
        """``_fast_rounded(nbytes)``, remembered for the last request: a loop that asks for the same
        int object again (a pair, a training step's sizes) makes no new int for its size."""
        if nbytes is self.memo_n:
            return self.memo_size
        size = _fast_rounded(nbytes)
        if size is not None:
            self.memo_n, self.memo_size = nbytes, size  # one step: no other thread runs in between
        return size

    cdef inline bint unlive(self, object ptr, object nbytes, u64 *n) except -1:
        """Take ``ptr`` out of the live table if it is live with exactly ``nbytes`` (an exact int),
        its size in ``n``: true; else change nothing (false: the locked path decides, with the precise
        error). Taken out, then put back on a mismatch, each one C step, as the Python build's
        ``live.pop``: two threads freeing one block cannot both take it."""
        cdef u64 p, want
        if type(ptr) is not int or not _key_of(ptr, &p) or not self.live.take_u(p, n):
            return False  # (a pointer that is not an int, even one equal to a live block's: the checked path)
        if _as_u64(nbytes, &want) and want == n[0] and want != 0:
            return True
        self.live.put_u(p, n[0])
        return False

    cdef inline object cached_pop(self, object stream, u64 size):
        """A block of ``size`` (a cache size: a multiple of 256, at most ``2**62``) from ``stream``'s
        cache, lock-free, or None."""
        cdef StateFields st = self.state_of(stream)
        if st is None:
            return None
        cache = st.cache
        if cache is None:  # retired
            return None
        lst = self.list_u(st, cache, size)
        if lst is None:
            return None
        return _pop_keep(<list>lst)  # None when empty (another thread may have taken the last one)

    cdef inline object list_u(self, StateFields st, object cache, u64 size):
        """``cache.get(size)`` for ``st``'s cache dict ``cache``, with no int made for ``size``:
        remembered for the last cache dict and size that had a list (a cache dict never loses or
        replaces a list: only ``register`` adds one, and a flush swaps the whole dict, so while
        ``cache`` is that dict the list is that list; the dict is held, so its identity cannot be
        reused); None at once for an empty dict (no int made); else the state's index while it stands
        for this dict and its sizes (:meth:`StateFields.list_for`); else the dict itself."""
        if cache is self.memo_cache and size == self.memo_usize:
            return self.memo_list
        if not (<dict>cache):  # no size is hot on this stream (a workload of sizes that never repeat)
            return None
        if st.index_cache is cache and st.index_len == len(st.hot):
            lst = st.list_for(size)
        else:
            lst = (<dict>cache).get(size)
        if lst is not None:
            self.memo_cache, self.memo_usize, self.memo_list = cache, size, lst  # one step (GIL held)
        return lst

    cdef object take_c(self, object size, object stream):
        """``Arena.take`` (lock held) for a cache size given as an int: :meth:`take_u` when it is a C
        value, else :meth:`take_other` (past ``2**64``)."""
        cdef u64 n
        if _as_u64(size, &n):
            return self.take_u(n, stream)
        return self.take_other(size, stream, self.state_of(stream))

    cdef object take_other(self, object size, object stream, StateFields st):
        """``Arena.take`` (lock held) where no compiled placement serves: a stream without a state (the
        arena's own), a size past what the default placement can hold (``Arena.find``), the source's
        ``fit`` and ``prepare`` (``Arena.find`` when the fit fails); then ``missed_again``."""
        if st is None:
            return self.take(size, stream)
        if self.default_fit:
            ptr = self.find(size, stream, True)  # nothing fits
        else:
            ptr = self.fit(self.arena, st, size)
            if ptr is None:
                ptr = self.find(size, stream, True)
            if self.prepare is not None:
                ptr = self.prepare(self.arena, ptr, size, stream)
        self.missed_again(size, stream, st)
        return ptr

    cdef inline object fit_default(self, StateFields st, u64 n, object stream):
        """The default placement of ``take_u`` for ``n`` bytes (a cache size) on ``st``, the stream's
        state (lock held): best fit, else ``Arena.find``, then the miss counted (``missed_again``),
        ``n`` an int only where Python code needs one (``find``, a size turning hot)."""
        ptr = self.best_fit(st, n)
        if ptr is None:
            ptr = self.find(n, stream, True)
        self.missed_again(n, stream, st)
        return ptr

    cdef object fit_pages(self, StateFields st, u64 n, object stream):
        """The source's plain placement over pages (``ChunkSource.plain_pages``) of ``take_u`` for ``n``
        bytes on ``st`` (lock held), step for step: the stream's cached blocks coalesced first, then
        best fit keeping the block that ends at the top for last, pages mapped only where missing, then
        the miss counted; ``n`` an int only where Python code needs one (``find``, ``prepare``, a size
        turning hot)."""
        cdef u64 top = 0, p
        if st.cached_c():
            st.flush(self.boundaries)
        cdef FreeList free = st.free
        cdef bint has_top = free.ending_at_u(<u64>self.source.top, &top)
        if free.take_u(n, has_top, top, &p):
            ptr = p
        else:
            ptr = self.find(n, stream, True)
        if not self.covered(ptr, n):  # the usual case: nothing to map, no call
            ptr = self.prepare(self.arena, ptr, n, stream)
        self.missed_again(n, stream, st)
        return ptr

    cdef bint covered(self, u64 p, u64 n) except -1:
        """Whether every page of ``[p, p + n)`` is in the source's coverage (``_Coverage.covers``:
        one bisection, its ranges being coalesced)."""
        cdef u64 lo = (p - self.base) // self.page, hi = (p + n - 1 - self.base) // self.page + 1
        cdef list starts = self.cov_starts
        cdef Py_ssize_t a = 0, b = len(starts), mid
        cdef u64 m
        while a < b:  # bisect_right
            mid = (a + b) >> 1
            m = starts[mid]
            if lo < m:
                b = mid
            else:
                a = mid + 1
        if a == 0:
            return False
        first = starts[a - 1]
        cdef u64 end = self.cov_end[first]
        return end >= hi

    cdef object best_fit(self, StateFields st, u64 n):
        """``StreamState.best_fit`` for ``n`` bytes (lock held): the free list searched once, for both
        the cached sizes worth a look and the block cut when none serves."""
        cdef FreeList free = st.free
        cdef MkPos it = free.best_c(n)
        cdef bint fits = free.is_best(it)
        cdef u64 best = free.size_of_best(it) if fits else (1ULL << 62)
        if st.hot:
            ptr = self.take_cached(st, n, best)
            if ptr is not None:  # else nothing changed: it still points at the best fit
                return ptr
        if not fits:
            return None
        return free.cut_at(it, n)

    cdef object take_cached(self, StateFields st, u64 n, u64 best):
        """``StreamState.take_cached`` for ``n`` bytes (lock held), ``best`` the free list's best fit
        (``1 << 62`` when nothing fits)."""
        if not st.indexed():
            st.reindex()
        cdef Py_ssize_t size = st.hot_sizes.size(), k, stop
        cdef Py_ssize_t j = mk_lower_u64(st.hot_sizes.data(), size, n)  # branch-free
        cdef u64 s
        cdef list lst
        stop = min(j + _CACHE_WINDOW, size)
        for k in range(j, stop):
            s = st.hot_sizes[k]
            if s >= best:
                return None
            lst = <list>PyList_GET_ITEM(st.hot_lists, k)
            if lst:
                ptr = _pop_keep(lst)
                if s > n:
                    st.free.insert_c(<u64>ptr + n, s - n, self.boundaries)
                return ptr
        return None

    cdef inline int missed_again(self, u64 size, object stream, StateFields st) except -1:
        """The end of ``Arena.take`` (lock held): the miss counted, and the size made hot for the stream
        when it missed again within the source's ``hot_distance``, ``hot_repeats`` times in a row (an
        int made for it only then). ``st``: the stream's state as the take found it; still attached (a
        state leaves the table only retired, its cache None), it is registered in C, else the table's
        state through Python."""
        if self.missed.note_c(size):
            self.missed_again_hot(size, stream, st)
        return 0

    cdef int missed_again_hot(self, object size, object stream, StateFields st) except -1:
        """``size`` (an int) turned hot for ``stream``: registered (see :meth:`missed_again`)."""
        if st is not None and st.cache is not None:  # still the table's state (rule 4)
            self.register(st, size)
        else:
            self.arena.state(stream).register(size, self.boundaries)
        return 0

    cdef int register(self, StateFields st, object size) except -1:
        """``StreamState.register`` (lock held) for a state in the table: ``size`` gets a cache list,
        the cache starting afresh (``flush``) when it has ``MAX_HOT`` sizes."""
        cache = st.cache
        if cache is None or size in <dict>cache:
            return 0
        if st.rehot:
            st.rehot.discard(size)
        cdef list hot = st.hot
        if len(hot) >= _MAX_HOT:
            st.flush(self.boundaries)
            cache, hot = st.cache, st.hot
        cdef list lst = []
        cdef u64 n = size
        cdef Py_ssize_t i = _bisect(hot, n)
        cdef bint indexed = st.indexed()
        (<dict>cache)[size] = lst
        hot.insert(i, size)  # not in hot (hot and the cache's keys agree)
        if indexed:  # the index follows
            st.index_add(i, n, lst)
        else:  # made again now: the lock-free paths look sizes up through it (list_u)
            st.reindex()
        return 0

    cdef int free_block_c(self, object ptr, object size, object stream) except -1:
        """``Arena.free_block`` (lock held)."""
        cdef StateFields st = self.state_of(stream)
        if st is None:
            self.free_block(ptr, size, stream)
            return 0
        return self.free_into(st, ptr, size, (<dict>st.cache).get(size))  # never retired (rule 4)

    cdef int free_into(self, StateFields st, object ptr, u64 size, object lst) except -1:
        """The end of ``Arena.free_block`` (lock held) for a state in the table, ``lst`` its cache
        list for ``size`` or None: the list (a size hot again after a flush gets one), else the free
        list."""
        if lst is None and st.rehot:  # StreamState.hot_again (most states have no size to look for)
            key = size  # the int, made only here
            if key in st.rehot:
                self.register(st, key)
                lst = (<dict>st.cache).get(key)
        if lst is None:
            st.free.insert_c(ptr, size, self.boundaries)
        else:
            (<list>lst).append(ptr)
            st.maybe_cached = True
        return 0

    cdef inline object locked_take(self, u64 size, object stream, object nbytes, u64 n, object big):
        """The locked step of an allocation of ``nbytes``: ``n`` its value and ``size`` its cache size as
        C values (an exact int request, the usual case: no int is made for the size unless Python code
        needs one, see :meth:`take_u`), or ``n`` 0 and ``big`` its cache size as an int (past ``2**62``,
        which the placement refuses)."""
        cdef u64 k
        if not self.lock.take():  # a finalizer allocating inside this thread's locked step
            self.arena.nested_allocation(nbytes)
        try:
            if self.deferred:  # frees made while the lock was taken: in their lists before the fit
                self.arena.apply_deferred()
            if n:
                ptr = self.take_u(size, stream)
                if not _key_of(ptr, &k):  # (every placement returns an address; as AddressTable.put)
                    raise TypeError(f"a block address must be an int in [0, 2**64 - 1), not {ptr!r}")
                self.live.put_u(k, n)
            else:
                ptr = self.take_c(big, stream)
                self.live.put(ptr, nbytes)
            if self.deferred:
                self.arena.apply_deferred()
        finally:
            self.lock.give()
        return ptr

    cdef inline object locked_take_int(self, object size, object stream, object nbytes):
        """:meth:`locked_take` for a request whose cache size ``size`` is an int already."""
        cdef u64 n
        if _request(nbytes, &n):
            return self.locked_take((n + 255) & ~(<u64>255), stream, nbytes, n, None)
        return self.locked_take(0, stream, nbytes, 0, size)

    cdef inline object take_u(self, u64 size, object stream):
        """``Arena.take`` (lock held) for a C size: the default placement and the plain one over pages
        without an int for ``size`` (:meth:`fit_default`, :meth:`fit_pages`); anything else through
        :meth:`take_other`."""
        cdef StateFields st = self.state_of(stream)
        if st is not None:
            if self.default_fit:
                return self.fit_default(st, size, stream)
            if self.pages_fit and (self.live.used or self.aligned):
                return self.fit_pages(st, size, stream)
        return self.take_other(size, stream, st)

    cdef inline int cache_or_free(self, object ptr, u64 size, object stream) except -1:
        """Put a freed block (no longer live; ``size`` its cache size) in its stream's cache if the
        size is hot, else in the free list under the lock; rule 3 (publish, then validate) as in the
        Python build."""
        cdef StateFields st = self.state_of(stream)
        cdef bint known = False  # st has no list for size, seen in this same step (GIL held)
        if st is not None:
            cache = st.cache
            if cache is not None:
                lst = self.list_u(st, cache, size)
                if lst is not None:
                    (<list>lst).append(ptr)
                    st.maybe_cached = True
                    if st.cache is cache:
                        return 0
                    self.rescue(lst, size, stream)  # each block freed or deferred (rule 8)
                    return 0
                known = True
        return self.free_locked(ptr, size, stream, st if known else None)

    cdef int free_locked(self, object ptr, u64 size, object stream, StateFields known) except -1:
        """The rest of :meth:`cache_or_free` (kept out of the lock-free part, which the hot path
        inlines): into the free list under the lock, or deferred (rule 8: a free never waits for it).
        ``known``: the stream's state, seen in the same step to have no list for the size (no Python
        code ran since, the GIL being held throughout: it is still in the table, still without one).
        ``size`` becomes an int only where Python code needs one (a deferred free, a size hot again, a
        stream without a state)."""
        if not self.lock.try_take():
            self.deferred.append((ptr, size, stream))
            return 0
        try:
            if known is not None:
                self.free_into(known, ptr, size, None)
            else:
                self.free_block_c(ptr, size, stream)
            if self.deferred:
                self.arena.apply_deferred()
        finally:
            self.lock.give()
        return 0

    cdef inline int locked_free(self, ptr, nbytes, stream, alignment) except -1:
        """A free the lock-free path did not accept: ``Arena.free_slow`` (checked, then freed or
        deferred)."""
        self.arena_free_slow(ptr, nbytes, stream, alignment)
        return 0


cdef inline bint _request(object nbytes, u64 *n) except -1:
    """Whether ``nbytes`` is a request the cache can serve (an exact int in ``[1, 2**62]``), its
    value in ``n``."""
    cdef int overflow = 0
    cdef long long v
    if type(nbytes) is not int:
        return False
    v = PyLong_AsLongLongAndOverflow(nbytes, &overflow)
    if overflow or v <= 0 or v > (1LL << 62):
        return False
    n[0] = <u64>v
    return True


cdef inline object _fast_rounded(object nbytes):
    """The cache's size for an exact int request (``nbytes > 0``; past ``2**62`` as a Python int, which
    the locked path refuses); ``None`` for anything else (the arena's checked path decides)."""
    cdef u64 n
    if _request(nbytes, &n):
        return (n + 255) & ~(<u64>255)
    if type(nbytes) is int and nbytes > 0:
        return (nbytes + 255) & -256
    return None


cdef class PlainPaths(_Base):
    """``allocate``/``deallocate``: a caching resource's own methods."""

    def allocate(self, nbytes=_ABSENT, stream=_ABSENT, alignment=256):
        """Allocate ``nbytes`` for work on ``stream``: an exact-size cache hit takes no lock."""
        if type(stream) is not _Stream:
            if stream is _ABSENT or nbytes is _ABSENT:
                raise _missing("allocate", ("nbytes", "stream"), (nbytes, stream))
            stream = self.to_stream(stream)
        cdef u64 n
        if alignment is not _DEFAULT:
            return self.allocate_slow(nbytes, stream, alignment)
        if _request(nbytes, &n):
            ptr = self.cached_pop(stream, (n + 255) & ~(<u64>255))
            if ptr is not None:
                self.live.put_u(<u64>ptr, n)
                return ptr
            return self.locked_take((n + 255) & ~(<u64>255), stream, nbytes, n, None)
        size = self.size_of(nbytes)
        if size is None:
            return self.allocate_slow(nbytes, stream, alignment)
        return self.locked_take(0, stream, nbytes, 0, size)  # an int past 2**62

    def deallocate(self, ptr=_ABSENT, nbytes=_ABSENT, stream=_ABSENT, alignment=256):
        """Return ``ptr`` (``nbytes`` as allocated) on ``stream``."""
        if type(stream) is not _Stream:
            if stream is _ABSENT or nbytes is _ABSENT or ptr is _ABSENT:
                raise _missing("deallocate", ("ptr", "nbytes", "stream"), (ptr, nbytes, stream))
            stream = self.to_stream(stream)
        if type(nbytes) is not int or alignment is not _DEFAULT:
            nbytes, alignment = _checked(nbytes, alignment)
            if alignment > 256:
                self.locked_free(ptr, nbytes, stream, alignment)
                return
        cdef u64 n
        if not self.unlive(ptr, nbytes, &n):  # zero, aligned blocks, and every error: the locked path decides
            self.locked_free(ptr, nbytes, stream, alignment)
            return
        self.cache_or_free(ptr, (n + 255) & ~(<u64>255), stream)


cdef class CountingPaths(_Base):
    """:class:`PlainPaths` that append ``+nbytes``/``-nbytes`` to an event list."""
    cdef list events
    cdef object on_full
    cdef Py_ssize_t limit
    cdef dict counted

    def __init__(self, arena, events, on_full, limit, counted):
        _Base.__init__(self, arena)
        self.events, self.on_full, self.limit, self.counted = events, on_full, limit, counted

    cdef int free_slow(self, ptr, nbytes, stream, alignment) except -1:
        c = self.counted.pop(ptr, None)  # forgotten first: once freed, another thread may get ptr again
        try:
            self.locked_free(ptr, nbytes, stream, alignment)
        except BaseException:
            if c is not None:
                self.counted[ptr] = c
            raise
        if c is not None:
            self.events.append(-nbytes)
            if len(self.events) > self.limit:
                self.on_full()
        return 0

    def allocate(self, nbytes=_ABSENT, stream=_ABSENT, alignment=256):
        """Allocate as the arena does, and count it."""
        if type(stream) is not _Stream:
            if stream is _ABSENT or nbytes is _ABSENT:
                raise _missing("allocate", ("nbytes", "stream"), (nbytes, stream))
            stream = self.to_stream(stream)
        cdef u64 n
        ptr = None
        if alignment is _DEFAULT and _request(nbytes, &n):
            ptr = self.cached_pop(stream, (n + 255) & ~(<u64>255))
            if ptr is not None:
                self.live.put_u(<u64>ptr, n)
        if ptr is None:
            size = self.size_of(nbytes) if alignment is _DEFAULT else None
            if size is None:
                ptr = self.allocate_slow(nbytes, stream, alignment)
                if ptr:
                    k = nbytes.__index__()
                    self.counted[ptr] = k
                    self.events.append(k)
                return ptr
            ptr = self.locked_take_int(size, stream, nbytes)
        self.counted[ptr] = nbytes
        self.events.append(nbytes)
        return ptr

    def deallocate(self, ptr=_ABSENT, nbytes=_ABSENT, stream=_ABSENT, alignment=256):
        """Free as the arena does, and count it (pending events stay within ``limit`` + live blocks)."""
        if type(stream) is not _Stream:
            if stream is _ABSENT or nbytes is _ABSENT or ptr is _ABSENT:
                raise _missing("deallocate", ("ptr", "nbytes", "stream"), (ptr, nbytes, stream))
            stream = self.to_stream(stream)
        if type(nbytes) is not int or alignment is not _DEFAULT:
            nbytes, alignment = _checked(nbytes, alignment)
            if alignment > 256:
                self.free_slow(ptr, nbytes, stream, alignment)
                return
        cdef u64 n
        if not self.unlive(ptr, nbytes, &n):
            self.free_slow(ptr, nbytes, stream, alignment)
            return
        if self.counted.pop(ptr, None) is not None:  # memory the adaptor never counted goes home uncounted
            self.events.append(-nbytes)
            if len(self.events) > self.limit:
                self.on_full()
        self.cache_or_free(ptr, (n + 255) & ~(<u64>255), stream)


cdef extern from *:
    """
    /* Whether the weak reference ref (checked by the caller) refers to obj, read without a call:
       PyWeakref_GetRef from Python 3.13 (PyWeakref_GET_OBJECT is deprecated there). */
    static inline int mrkit_weakref_is(PyObject *ref, PyObject *obj) {
    #if PY_VERSION_HEX >= 0x030D0000
        PyObject *o = NULL;
        if (PyWeakref_GetRef(ref, &o) < 0) return -1;
        Py_XDECREF(o);
        return o == obj;
    #else
        return PyWeakref_GET_OBJECT(ref) == obj;
    #endif
    }
    """
    int mrkit_weakref_is(object ref, object obj) except -1


cdef inline bint _refers_to(object ref, object obj) except -1:
    """``ref() is obj``: a weak reference read in C (no call), any other callable called."""
    if PyWeakref_CheckRef(ref):
        return mrkit_weakref_is(ref, obj)
    return ref() is obj


cdef class HookPaths(_Base):
    """``malloc(nbytes, device_id)``/``free(ptr, device_id)`` for hooks that name no stream."""
    cdef object current_stream, remember, foreign_free
    cdef list seen
    cdef readonly AddressTable where  # block -> the stream it was allocated on

    def __init__(self, arena, current_stream, seen, remember, foreign_free):
        _Base.__init__(self, arena)
        self.current_stream, self.seen = current_stream, seen
        self.remember, self.foreign_free = remember, foreign_free
        self.where = AddressTable(True)

    cdef object malloc_n(self, size_t n, int device_id):
        """:meth:`malloc_c` for a C size (CuPy's C route): a cache hit makes no int but the block's
        address."""
        cdef u64 p
        stream = self.stream_now(device_id)
        if n == 0 or n > (1ULL << 62):
            return self.malloc_other(n, stream)
        ptr = self.cached_pop(stream, (n + 255) & ~(<u64>255))
        if ptr is None:
            ptr = self.locked_take((n + 255) & ~(<u64>255), stream, n, n, None)
        else:
            self.live.put_u(<u64>ptr, n)
        _key_of(ptr, &p)  # an address the engine made
        self.where.put_obj(p, stream)
        return ptr

    cdef object malloc_c(self, object nbytes, int device_id):
        cdef u64 n
        if _request(nbytes, &n):
            return self.malloc_n(n, device_id)
        return self.malloc_other(nbytes, self.stream_now(device_id))

    cdef object stream_now(self, int device_id):
        """The mrkit stream of the caller's current stream on ``device_id``."""
        cs = self.current_stream(device_id)
        ref, stream = <tuple>self.seen[0]
        if not _refers_to(ref, cs):  # not the stream seen last
            stream = self.remember(cs)
        return stream

    cdef object malloc_other(self, object nbytes, object stream):
        """A request the cache cannot serve, on ``stream``: zero, other integer types and bad sizes
        (the arena's checked path), or past ``2**62`` (the locked path, which refuses it)."""
        size = _fast_rounded(nbytes)
        ptr = self.allocate_slow(nbytes, stream, 256) if size is None else self.locked_take_int(size, stream, nbytes)
        if ptr:
            self.where[ptr] = stream
        return ptr

    cdef int free_c(self, object ptr, int device_id) except -1:
        if not self.try_free(ptr):
            self.foreign_free(ptr)
        return 0

    cdef bint try_free(self, object ptr) except -1:
        """Free ``ptr`` if it is one of these hooks' live blocks (true), else change nothing (false)."""
        cdef u64 p, n
        if not _key_of(ptr, &p):
            return False
        stream = self.where.take_obj(p)
        if stream is None:
            return False
        if not self.live.take_u(p, &n):  # cannot happen while ``where`` and ``live`` agree; the lock decides
            self.locked_free(ptr, -1, stream, 256)
            return True
        self.cache_or_free(ptr, (n + 255) & ~(<u64>255), stream)
        return True

    def malloc(self, nbytes, device_id):
        """Allocate ``nbytes`` on the caller's current stream of ``device_id``."""
        return self.malloc_c(nbytes, device_id)

    def free(self, ptr, device_id):
        """Free ``ptr`` on the stream it was allocated on."""
        self.free_c(ptr, device_id)

    def holds(self, ptr):
        """Whether ``ptr`` is one of these hooks' live blocks."""
        return ptr in self.where


cdef class CHooks:
    """Allocator hooks callable from C over a table ``device -> (malloc, free, holds, core)``: entries
    made by :func:`hook_paths` (``core`` their :class:`HookPaths`) run without a Python call; others
    are called as Python functions.

    ``bind(device)`` fills a missing entry (and may raise); ``made`` lists every entry ever made,
    newest last, for blocks whose entry has been replaced since; ``exiting[0]`` true means the
    interpreter is exiting: a free that fails is counted in ``late`` (``[accepted, not_done]``)."""
    cdef object table  # a dict (or a subclass: read with PyDict_GetItemWithError)
    cdef object bind
    cdef list made, late, exiting

    def __init__(self, table, bind, made, exiting, late):
        if not isinstance(table, dict):
            raise TypeError(f"table must be a dict, not {type(table).__name__}")
        self.table, self.bind, self.made, self.exiting, self.late = table, bind, made, exiting, late

    @property
    def addresses(self):
        """``(param, malloc, free)`` as integers, for ``cupy.cuda.memory.CFunctionAllocator``
        (keep this object alive as its owner)."""
        return (<intptr_t><void*>self, <intptr_t>&_c_malloc, <intptr_t>&_c_free)

    cdef object entry(self, int device_id):
        cdef PyObject *r = PyDict_GetItemWithError(self.table, device_id)
        if r is NULL:
            return self.bind(device_id)
        return <object>r

    cdef int free_c(self, object ptr, int device_id) except -1:
        cdef PyObject *r = PyDict_GetItemWithError(self.table, device_id)
        e = None if r is NULL else <object>r
        if e is not None:  # the usual case: a block of the device's current hooks, freed in one look-up
            core = (<tuple>e)[3]
            if core is not None:
                if (<HookPaths>core).try_free(ptr):
                    return 0
            elif (<tuple>e)[2](ptr):
                (<tuple>e)[1](ptr, device_id)
                return 0
        for old in reversed(self.made):  # not the current hooks' block: the hooks made earlier, newest first
            if _holds(old, ptr):
                e = old
                break
        else:
            if e is None:
                raise ValueError(f"a free of {ptr:#x}, which these hooks do not hold")
        core = (<tuple>e)[3]  # the block's hooks, or the current ones (their foreign free)
        if core is not None:
            (<HookPaths>core).free_c(ptr, device_id)
        else:
            (<tuple>e)[1](ptr, device_id)
        return 0


cdef inline bint _holds(object e, object ptr) except -1:
    core = (<tuple>e)[3]
    if core is not None:
        return ptr in (<HookPaths>core).where  # AddressTable.__contains__
    return bool((<tuple>e)[2](ptr))


cdef void *_c_malloc(void *param, size_t nbytes, int device_id) except? <void*>-1:
    # Called with the GIL held (CuPy allocates from Python code). An error comes back as (void *)-1
    # with the exception set: CuPy 14 calls this through an ``intptr_t`` function compiled under
    # Cython's default ``except? -1``, which looks for an exception only when -1 comes back (NULL with
    # an exception set became CuPy's SystemError, and every OutOfMemoryError was lost in it).
    self = <CHooks>param
    e = self.entry(device_id)
    core = (<tuple>e)[3]
    if core is not None:
        ptr = (<HookPaths>core).malloc_n(nbytes, device_id)
    else:
        ptr = (<tuple>e)[0](nbytes, device_id)
    return <void*><intptr_t>ptr


cpdef intptr_t cupy_call_malloc(intptr_t param, intptr_t malloc_func, size_t size, int device_id) except? -1:
    """What CuPy 14's ``CFunctionAllocatorMemory`` does with a C ``malloc`` (its ``_call_malloc``: an
    ``intptr_t`` function under Cython's default ``except? -1``, as this one): the pointer; an
    exception the function leaves set is raised when it returns -1, and with any other value stays set
    (so the interpreter fails the call with SystemError, as with CuPy). For the tests' fake CuPy."""
    return <intptr_t>(<void *(*)(void *, size_t, int) noexcept>malloc_func)(<void *>param, size, device_id)


cdef void _c_free(void *param, void *ptr, int device_id) noexcept:
    # called with the GIL held (CuPy frees from a memory object's deallocator)
    # an error is reported as a Python finalizer's would be (sys.unraisablehook), never raised
    self = <CHooks>param
    p = <intptr_t>ptr
    if not self.exiting[0]:
        self.free_c(p, device_id)
        return
    self.late[0] += 1
    try:
        self.free_c(p, device_id)
    except BaseException:
        self.late[1] += 1


def rounding_call(inner, Py_ssize_t unit, too_large=None):
    """``call(size)`` calls ``inner(size rounded up to unit)``: an allocator entry point with a
    rounding contract (CuPy's 512 bytes), ``call.rounding`` the unit, and room for attributes of its
    own. A closure, not a class with ``__call__``: a Cython function is called through vectorcall and
    its typed argument rounds in C (a class's ``__call__`` builds an argument tuple and rounds Python
    ints: 87 ns against 34 ns a call on the development machine, 20 ns of it the inner call).

    Sizes up to ``2**62`` round in C; larger ones round as Python ints (never wrapped), and a rounded
    size of ``2**64`` or more, which C's ``size_t`` cannot hold, is ``too_large(n)``'s (the resource's
    own refusal) where given."""
    cdef long long mask = unit - 1

    @cython.binding(True)  # a function object with attributes of its own (the module's default is False)
    def call(size):
        cdef int overflow = 0
        cdef long long v
        if type(size) is int:
            v = PyLong_AsLongLongAndOverflow(size, &overflow)
            if not overflow and 0 <= v <= (1LL << 62):
                return inner((v + mask) & ~mask)
        n = _rounded_size(size, unit)  # the precise error for anything but an int >= 0
        if too_large is not None and n >= (1 << 64):
            return too_large(n)
        return inner(n)
    call.rounding = unit
    return call


def plain_paths(arena):
    p = PlainPaths(arena)
    return p.allocate, p.deallocate


def counting_paths(arena, events, on_full, limit, counted):
    p = CountingPaths(arena, events, on_full, limit, counted)
    return p.allocate, p.deallocate


def hook_paths(arena, *, current_stream, seen, remember, foreign_free):
    p = HookPaths(arena, current_stream, seen, remember, foreign_free)
    return p.malloc, p.free, p.holds, p


# -- PyTorch's pluggable allocator ---------------------------------------------------------------
# PyTorch calls ``void* alloc(size_t size, int device, cudaStream_t stream)`` and ``void free(void* ptr,
# size_t size, int device, cudaStream_t stream)``: plain C functions with no user data. A fixed set of
# C trampolines, one pair per slot, each calls the Python callbacks object stored in its slot (taking
# the GIL, as PyTorch may call from any thread). A slot, once given, is kept for the process: PyTorch
# may free through it however late.
cdef extern from *:
    """
    typedef void* (*mrkit_talloc_impl_t)(int, size_t, int, void*);
    typedef void (*mrkit_tfree_impl_t)(int, void*, size_t, int, void*);
    static mrkit_talloc_impl_t mrkit_talloc_impl = 0;
    static mrkit_tfree_impl_t mrkit_tfree_impl = 0;
    #define MRKIT_TORCH_SLOT(b, o) \\
        static void* mrkit_talloc_##b##_##o(size_t n, int d, void* s) { return mrkit_talloc_impl(b * 8 + o, n, d, s); } \\
        static void mrkit_tfree_##b##_##o(void* p, size_t n, int d, void* s) { mrkit_tfree_impl(b * 8 + o, p, n, d, s); }
    #define MRKIT_TORCH_ROW(b) MRKIT_TORCH_SLOT(b, 0) MRKIT_TORCH_SLOT(b, 1) MRKIT_TORCH_SLOT(b, 2) MRKIT_TORCH_SLOT(b, 3) \\
        MRKIT_TORCH_SLOT(b, 4) MRKIT_TORCH_SLOT(b, 5) MRKIT_TORCH_SLOT(b, 6) MRKIT_TORCH_SLOT(b, 7)
    #define MRKIT_TORCH_FNS(kind, b) (void*)mrkit_##kind##_##b##_0, (void*)mrkit_##kind##_##b##_1, \\
        (void*)mrkit_##kind##_##b##_2, (void*)mrkit_##kind##_##b##_3, (void*)mrkit_##kind##_##b##_4, \\
        (void*)mrkit_##kind##_##b##_5, (void*)mrkit_##kind##_##b##_6, (void*)mrkit_##kind##_##b##_7
    #define MRKIT_TORCH_TABLE(kind) { \\
        MRKIT_TORCH_FNS(kind, 0), MRKIT_TORCH_FNS(kind, 1), MRKIT_TORCH_FNS(kind, 2), MRKIT_TORCH_FNS(kind, 3), \\
        MRKIT_TORCH_FNS(kind, 4), MRKIT_TORCH_FNS(kind, 5), MRKIT_TORCH_FNS(kind, 6), MRKIT_TORCH_FNS(kind, 7)}
    MRKIT_TORCH_ROW(0) MRKIT_TORCH_ROW(1) MRKIT_TORCH_ROW(2) MRKIT_TORCH_ROW(3)
    MRKIT_TORCH_ROW(4) MRKIT_TORCH_ROW(5) MRKIT_TORCH_ROW(6) MRKIT_TORCH_ROW(7)
    static void* mrkit_talloc_table[64] = MRKIT_TORCH_TABLE(talloc);
    static void* mrkit_tfree_table[64] = MRKIT_TORCH_TABLE(tfree);
    #define MRKIT_TORCH_SLOTS 64
    """
    ctypedef void* (*talloc_impl_t)(int, size_t, int, void*)
    ctypedef void (*tfree_impl_t)(int, void*, size_t, int, void*)
    talloc_impl_t mrkit_talloc_impl
    tfree_impl_t mrkit_tfree_impl
    void* mrkit_talloc_table[64]
    void* mrkit_tfree_table[64]
    int MRKIT_TORCH_SLOTS

cdef list _torch_slots = []


# A free PyTorch makes from a thread that does not hold the GIL (its OOM path releasing cached segments
# under its allocator lock, a C++ thread) is queued in C and applied later with the GIL: waiting for the
# GIL there could deadlock against a thread that holds the GIL and waits for PyTorch's lock (freeing a
# tensor). The queue is applied before every allocation, by a pending call on the main thread soon
# after, and by ``drain_torch_frees()``.
cdef extern from "Python.h":
    int PyGILState_Check() nogil
    int Py_AddPendingCall(int (*func)(void*) noexcept, void *arg) nogil

ctypedef struct _PendingFree:
    int slot
    void *ptr
    size_t nbytes
    int device
    void *stream

cdef _PendingFree *_pending = NULL
cdef Py_ssize_t _pending_len = 0
cdef Py_ssize_t _pending_cap = 0
cdef bint _drain_scheduled = 0
cdef PyThread_type_lock _pending_lock = PyThread_allocate_lock()


cdef void *_talloc(int slot, size_t nbytes, int device, void *stream) noexcept with gil:
    _drain()
    try:
        ptr = _torch_slots[slot].alloc(nbytes, device, <intptr_t>stream)
    except BaseException:  # the callbacks catch everything; a refusal is NULL, never an exception
        return NULL
    return NULL if ptr is None else <void*><intptr_t>ptr


cdef void _free_now(int slot, void *ptr, size_t nbytes, int device, void *stream) noexcept with gil:
    try:
        _torch_slots[slot].free(<intptr_t>ptr, nbytes, device, <intptr_t>stream)
    except BaseException:  # the callbacks catch everything; nothing may escape into C
        pass


cdef bint _queue(int slot, void *ptr, size_t nbytes, int device, void *stream) noexcept nogil:
    """Queue a free (no GIL needed); false when the queue cannot grow."""
    cdef _PendingFree *grown
    cdef bint schedule
    PyThread_acquire_lock(_pending_lock, 1)
    global _pending, _pending_len, _pending_cap, _drain_scheduled
    if _pending_len == _pending_cap:
        grown = <_PendingFree*>realloc(_pending, (2 * _pending_cap + 16) * sizeof(_PendingFree))
        if grown is NULL:
            PyThread_release_lock(_pending_lock)
            return 0
        _pending, _pending_cap = grown, 2 * _pending_cap + 16
    _pending[_pending_len].slot = slot
    _pending[_pending_len].ptr = ptr
    _pending[_pending_len].nbytes = nbytes
    _pending[_pending_len].device = device
    _pending[_pending_len].stream = stream
    _pending_len += 1
    schedule = not _drain_scheduled
    _drain_scheduled = 1
    PyThread_release_lock(_pending_lock)
    if schedule and Py_AddPendingCall(_drain_soon, NULL) != 0:
        _drain_scheduled = 0  # the interpreter's queue is full: the next allocation drains
    return 1


cdef void _tfree(int slot, void *ptr, size_t nbytes, int device, void *stream) noexcept nogil:
    if PyGILState_Check() or not _queue(slot, ptr, nbytes, device, stream):
        _free_now(slot, ptr, nbytes, device, stream)


cdef Py_ssize_t _drain() noexcept with gil:
    """Apply every queued free (GIL held); the number applied."""
    cdef _PendingFree *batch
    cdef Py_ssize_t n, i, done = 0
    global _pending, _pending_len, _pending_cap, _drain_scheduled
    while True:
        # taken with the GIL held: a holder (``_queue``) never waits for the GIL, so this cannot deadlock
        PyThread_acquire_lock(_pending_lock, 1)
        batch, n = _pending, _pending_len
        _pending, _pending_len, _pending_cap = <_PendingFree*>NULL, 0, 0
        _drain_scheduled = 0
        PyThread_release_lock(_pending_lock)
        if n == 0:
            free(batch)
            return done
        for i in range(n):
            _free_now(batch[i].slot, batch[i].ptr, batch[i].nbytes, batch[i].device, batch[i].stream)
        free(batch)
        done += n


cdef int _drain_soon(void *arg) noexcept with gil:
    _drain()
    return 0


mrkit_talloc_impl = _talloc
mrkit_tfree_impl = _tfree


def drain_torch_frees():
    """Apply the frees PyTorch made from threads without the GIL that are still queued; the number."""
    return _drain()


def torch_callbacks(callbacks):
    """``(alloc, free)``: the addresses of a pair of C functions with PyTorch's pluggable-allocator
    signatures that call ``callbacks.alloc(size, device, stream)`` / ``callbacks.free(ptr, size,
    device, stream)``; ``None`` when every slot is taken. The slot and ``callbacks`` are kept for the
    process."""
    k = len(_torch_slots)
    if k >= MRKIT_TORCH_SLOTS:
        return None
    _torch_slots.append(callbacks)
    return <intptr_t>mrkit_talloc_table[k], <intptr_t>mrkit_tfree_table[k]


#: the arena's constants as compiled here (``tests/test_engine_parts.py`` holds them to ``_arena``'s)
CONSTANTS = {"_CACHE_WINDOW": _CACHE_WINDOW, "MAX_HOT": _MAX_HOT}
