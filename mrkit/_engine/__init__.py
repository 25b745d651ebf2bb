"""The engine every caching resource shares (``PoolResource``, ``VirtualMemoryResource``,
``BinningResource``): free lists, the per-stream :class:`Arena`, the :class:`ChunkSource` hooks and the
lock-free hot path (:mod:`._hot`), written as real functions.

A caching resource is a :class:`CachingResource`: an arena plus a chunk source. Integrations that
want the hot path in another variant (statistics fused in, CuPy's allocator hooks) ask
:func:`hot_paths`, the public entry point, never a private name.
"""
from __future__ import annotations

from .._owned import Closing, give_back_dropped, give_back_when_dropped
from .._resource import MemoryResource
from ._arena import GRAIN, Arena, ChunkSource, StreamState
from . import _hot
from ._hot import rounded_size
from ._freelist import FreeList, drain
from ._core import c_hooks, core_description, core_name, paths, python_core, rounding_call, torch_callbacks, \
    drain_torch_frees

__all__ = ["Arena", "ChunkSource", "StreamState", "FreeList", "drain", "GRAIN", "CachingResource",
           "hot_paths", "rounded_size", "core_name", "core_description", "python_core", "c_hooks", "rounding_call", "torch_callbacks",
           "drain_torch_frees"]


class CachingResource(Closing, MemoryResource):
    """Base of the resources built on an :class:`Arena`: ``allocate``/``deallocate`` are the arena's
    hot path (per-instance functions stored in slots, so a call makes no attribute look-up on
    ``self``; a subclass that overrides them still reaches these through ``super()``).

    ``arena`` is the engine state (advanced use: inspection, :func:`hot_paths`). A caching resource
    collected without ``close()`` gives its free memory back (every chunk holding no live block) when
    the next caching resource is built, in that thread (never from the collector itself), after
    waiting for the whole device: nobody is left to say which streams still use that memory.
    ``with resource as mr:`` closes it at the end of the block."""

    __slots__ = ("arena", "allocate", "deallocate")

    def _attach(self, arena: Arena) -> None:
        give_back_dropped()  # what resources collected without close() hold goes back first
        self.arena = arena
        _ALLOCATE.__set__(self, arena.allocate)
        _DEALLOCATE.__set__(self, arena.deallocate)
        give_back_when_dropped(self, *self._when_dropped())

    def _when_dropped(self) -> tuple:
        """``(fn, *args)`` giving the free memory back once this resource is collected; it must not
        refer to the resource (the arena does not: it holds its owner weakly). The arena stays usable:
        a hot path someone kept still works."""
        return (_release_dropped, self.arena)

    @property
    def live_bytes(self) -> int:
        """Bytes handed out (as requested, before rounding) and not yet returned."""
        with self.arena.lock:
            return self.arena.live_total()

    @property
    def free_bytes(self) -> int:
        """Bytes held and free in some stream's lists."""
        with self.arena.lock:
            return self.arena.free_total()

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return id(self)


_ALLOCATE = CachingResource.__dict__["allocate"]
_DEALLOCATE = CachingResource.__dict__["deallocate"]


def hot_paths(resource, variant: str, **names):
    """``resource``'s hot path in another variant, or ``None`` when ``resource`` is not a
    :class:`CachingResource` whose ``allocate``/``deallocate`` are the stock ones (a subclass that
    overrides them keeps its own behaviour).

    ``variant``: ``"counting"`` (``events``, ``on_full``, ``limit``: see ``_hot.counting_paths``) or
    ``"hook"`` (see ``_hot.hook_paths``), in the build the arena was made with; ``"route"`` (see
    ``_hot.route_paths``), in the Python build only (``None`` in the compiled one, whose callers take
    the C hooks of :func:`c_hooks`)."""
    arena = getattr(resource, "arena", None)
    if not isinstance(arena, Arena):
        return None
    if resource.allocate is not arena.allocate or resource.deallocate is not arena.deallocate:
        return None
    build = arena.build
    if variant == "counting":
        return build.counting_paths(arena, **names)
    if variant == "hook":
        return build.hook_paths(arena, **names)
    if variant == "route":
        return build.route_paths(arena, **names) if build is _hot else None
    raise ValueError(f"unsupported variant: {variant!r} (expected 'counting', 'hook' or 'route')")


def _release_dropped(arena: Arena) -> None:
    """A collected caching resource's :meth:`Arena.release`. Its streams' states say which stream
    freed each block, but not what other streams still do with it (a buffer read on a consumer stream
    and freed on its own, say): the device is waited for first, so no chunk goes back upstream under
    work still queued. Nothing is waited for when the arena holds no chunk (closed or released)."""
    if arena.chunks:
        arena.wait_for_device()
        arena.release()
