"""Which foreign stream classes drop their weak references when an object dies (run on the GPU machine):
for each, mrkit's judgement (``_weakref_safe``) and what happens: an object made, watched by a weak
reference with a callback, deleted and collected; ``cleared`` is true when the callback ran and the
reference reads None (false: the reference outlived the object, and reads freed memory)."""
import gc
import weakref

from mrkit._stream import _weakref_safe


def check(name, make):
    try:
        obj = make()
    except Exception as exc:  # noqa: BLE001 - a library missing here
        print(f"{name}: not made ({type(exc).__name__}: {exc})")
        return
    tp = type(obj)
    giver = next((c for c in reversed(tp.__mro__) if c.__weakrefoffset__), None)
    fired = []
    ref = weakref.ref(obj, lambda r: fired.append(1))
    del obj
    gc.collect()
    print(f"{name}: mrkit trusts {_weakref_safe(tp)}; slot from {giver.__module__}.{giver.__qualname__} "
          f"(class statement: {'__weakref__' in giver.__dict__}); cleared {bool(fired) and ref() is None}",
          flush=True)


def main():
    import cupy
    check("cupy.cuda.Stream", lambda: cupy.cuda.Stream(non_blocking=True))
    check("cupy.cuda.ExternalStream", lambda: cupy.cuda.ExternalStream(cupy.cuda.Stream(non_blocking=True).ptr))
    import torch
    check("torch.cuda.Stream", lambda: torch.cuda.Stream())
    check("torch.cuda.ExternalStream", lambda: torch.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))
    check("torch.Stream", lambda: torch.Stream("cuda"))
    try:
        from cuda.core import Device
        d = Device(0)
        d.set_current()
        check("cuda.core Stream", lambda: d.create_stream())
    except ImportError as exc:
        print(f"cuda.core: {exc}")


if __name__ == "__main__":
    main()
