"""What copying, pickling and dropping mean for an object that owns memory or a driver handle:
``Owned`` (shared by reference, never pickled) and the queue through which a resource collected without
``close()`` gives its free memory back; ``Closing``: ``with`` for whatever has ``close()``."""
from __future__ import annotations

import collections
import warnings
import weakref

__all__ = ["Owned", "Closing", "give_back_when_dropped", "give_back_dropped"]


class Owned:
    """For objects that own memory or a CUDA handle of this process (resources, adaptors, streams,
    events, driver pools): ``copy.copy`` and ``copy.deepcopy`` return the object itself, so a
    container holding one still copies and shares it; a second object owning the same block, chunk
    or handle would give it back twice. Pickling raises ``TypeError`` naming the class, followed by
    the class's ``_pickle_advice``: what it owns has no meaning in another process."""

    __slots__ = ()
    _pickle_advice = ""

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError(f"cannot pickle a {type(self).__name__}: it owns memory or a CUDA handle of this process"
                        f"{self._pickle_advice}")


class Closing:
    """``with obj as o:`` calls ``obj.close()`` at the end of the block. Leaving normally, an error of
    ``close()`` (a resource refusing while allocations are live) is raised. Leaving by an exception,
    that exception stays the one raised: a ``ValueError`` of ``close()`` is added to it as a note
    (Python 3.11+) and the object stays open, its live blocks valid until they are freed."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except ValueError as refused:
            if hasattr(exc, "add_note"):
                exc.add_note(f"mrkit: not closed on the way out: {refused}")


# -- what a dropped resource holds goes back ---------------------------------------------------------
_dropped: collections.deque = collections.deque()  # (fn, args) of resources collected since


def give_back_when_dropped(obj, fn, *args) -> weakref.finalize:
    """When ``obj`` is collected, queue ``fn(*args)`` (which must not refer to ``obj``) for
    :func:`give_back_dropped`. The collector only queues it: it may run in a thread that holds a lock
    ``fn`` needs. Nothing is queued during interpreter exit (the process's memory goes with it).
    Returns the finalizer: ``detach()`` it once ``obj`` has given back what it held itself."""
    fin = weakref.finalize(obj, _dropped.append, (fn, args))
    fin.atexit = False
    return fin


def give_back_dropped() -> None:
    """Run what resources collected since the last call queued (their free memory back upstream); a
    failure is a ``RuntimeWarning`` naming it, never an error of the caller's."""
    while _dropped:
        try:
            fn, args = _dropped.popleft()
        except IndexError:  # another thread took the last one
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - the caller's own work is not at fault
            warnings.warn(f"mrkit: giving back the memory of a dropped resource failed: {exc!r}",
                          RuntimeWarning, stacklevel=2)
