"""``Owned``: what copying and pickling mean for an object that owns memory or a driver handle."""
from __future__ import annotations

__all__ = ["Owned"]


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
