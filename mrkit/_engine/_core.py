"""Which build of the hot path runs: the compiled one (``_hotc``, Cython) when it was built and
``MRKIT_NO_EXTENSIONS`` is not set, else the Python one (``_hot``). Both have one semantics.

:func:`python_core` makes arenas built inside it use the Python build whatever is installed: the
testing kit builds its resources there, because its controlled interleavings switch threads at Python
lines (and the mutation suite plants its bugs in Python source)."""
from __future__ import annotations

import os
from contextlib import contextmanager

from . import _hot

_forced = [0]
_reason = ""
try:
    if os.environ.get("MRKIT_NO_EXTENSIONS", "").strip() not in ("", "0"):
        raise ImportError("MRKIT_NO_EXTENSIONS is set")
    from . import _hotc  # type: ignore[attr-defined]
except ImportError as exc:  # no compiler where it was installed, or forced off
    _hotc = None
    _reason = str(exc) if "MRKIT_NO_EXTENSIONS" in str(exc) else "the extension is not built"


def core_name() -> str:
    """``"compiled"`` or ``"python"``: the build new arenas use now."""
    return "compiled" if _hotc is not None and not _forced[0] else "python"


def core_description() -> str:
    """One line for ``mrkit info``: which core runs and, for the Python one, why."""
    if _hotc is not None:
        return f"compiled (Cython, {os.path.basename(_hotc.__file__)})"
    if "MRKIT_NO_EXTENSIONS" in _reason:
        return f"python ({_reason})"
    return f"python ({_reason}: install with a C++ compiler present for the compiled core)"


def paths():
    """The module whose ``plain_paths``/``counting_paths``/``hook_paths`` new arenas use."""
    return _hotc if _hotc is not None and not _forced[0] else _hot


def c_hooks(table: dict, bind, made: list, exiting: list, late: list):
    """Allocator hooks callable from C over ``table`` (see ``_hotc.CHooks``), or ``None`` in the
    Python build."""
    if _hotc is None or _forced[0]:
        return None
    return _hotc.CHooks(table, bind, made, exiting, late)


def torch_callbacks(callbacks):
    """``(alloc, free)`` C function addresses with PyTorch's pluggable-allocator signatures calling
    ``callbacks``, or ``None`` (the Python build, or every slot taken: the caller makes them with
    ``ctypes``)."""
    if _hotc is None or _forced[0]:
        return None
    return _hotc.torch_callbacks(callbacks)


def drain_torch_frees() -> int:
    """Apply the PyTorch frees still queued by the compiled build's C callbacks (frees made from threads
    without the GIL); the number applied (always 0 in the Python build, which queues none)."""
    if _hotc is None:
        return 0
    return _hotc.drain_torch_frees()


def rounding_call(inner, unit: int, too_large=None):
    """``call(size) -> inner(size rounded up to unit)``, compiled (``None`` in the Python build);
    ``too_large(n)`` takes a rounded size C's ``size_t`` cannot hold."""
    return None if _hotc is None else _hotc.rounding_call(inner, unit, too_large)


@contextmanager
def python_core():
    """Arenas (and integration hooks) built inside use the Python build."""
    _forced[0] += 1
    try:
        yield
    finally:
        _forced[0] -= 1
