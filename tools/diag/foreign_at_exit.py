"""A pytest plugin for diagnosing a crash at interpreter exit (``-p foreign_at_exit`` with
``tools/diag`` on ``PYTHONPATH``): when the session ends, name every foreign stream object that
``mrkit._stream._foreign`` still holds a weak reference to, then drop those references one by one,
naming each first (a crash there names the object), then run the collector."""
import gc
import sys


def pytest_unconfigure(config):
    m = sys.modules.get("mrkit._stream")
    if m is None:
        return
    data = m._foreign.data
    print(f"\n[foreign_at_exit] {len(data)} foreign streams held", file=sys.stderr, flush=True)
    for ref in list(data):
        obj = ref()
        print(f"[foreign_at_exit] dropping {type(ref).__name__} -> {type(obj).__module__}.{type(obj).__qualname__} "
              f"(alive {obj is not None}, refs {sys.getrefcount(obj) if obj is not None else 0})",
              file=sys.stderr, flush=True)
        del obj
        data.pop(ref, None)
        del ref
    gc.collect()
    print("[foreign_at_exit] done", file=sys.stderr, flush=True)
