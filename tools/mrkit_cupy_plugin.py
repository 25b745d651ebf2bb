"""A pytest plugin that runs CuPy's own test suite with mrkit as CuPy's device allocator and counts
what a block lost to the garbage collector prints ("Exception ignored in ..."):

    PYTHONPATH=$PWD python3 -m pytest -p tools.mrkit_cupy_plugin <cupy>/tests/cupy_tests/...

At the end it prints ``mrkit-cupy: N unraisable`` and mrkit's pool's live bytes after a collection."""
import gc
import sys

import mrkit
import mrkit.cupy

_seen = []
_old_hook = sys.unraisablehook


def _hook(u):
    _seen.append(f"{u.err_msg}: {u.exc_type.__name__}: {u.exc_value}")
    _old_hook(u)


def pytest_configure(config):
    sys.unraisablehook = _hook
    mrkit.cupy.install()


def pytest_unconfigure(config):
    gc.collect()
    mr = mrkit.cupy.resource_of()
    print(f"\nmrkit-cupy: {len(_seen)} unraisable; core {mrkit._engine.core_name()}; resource {mr!r}", file=sys.stderr)
    for s in _seen[:10]:
        print("  ", s[:300], file=sys.stderr)
