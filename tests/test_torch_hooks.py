"""mrkit.torch's C callbacks on the simulator, called through ctypes exactly as PyTorch calls them
(a stand-in ``torch`` records the function pointers it is given); the real PyTorch runs in
tests/test_gpu_torch.py."""
from __future__ import annotations

import ctypes
import sys
import types

import pytest

import mrkit
from mrkit import DeviceMemoryResource, LimitingAdaptor, PoolResource, Stream

ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


def _fake_torch(monkeypatch, *, internals=True):
    torch = types.ModuleType("torch")
    torch.__version__ = "0.fake"
    torch._C = types.SimpleNamespace()
    torch.cuda = types.SimpleNamespace(OutOfMemoryError=type("OutOfMemoryError", (RuntimeError,), {}))
    made = []
    if internals:
        def custom(alloc_ptr, free_ptr):  # what torch._C._cuda_customAllocator receives: two C addresses
            made.append((ALLOC(alloc_ptr), FREE(free_ptr)))
            return ("raw allocator", len(made))
        torch._C._cuda_customAllocator = custom
        torch._C._cuda_beginAllocateToPool = lambda dev, pool_id: made.append(("routed", dev, pool_id))

        class MemPool:
            def __init__(self, raw):
                self.raw, self.id = raw, (1, len(made))

        class _Device:  # torch.cuda.device(d): a context manager
            def __init__(self, d):
                self.d = d

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        torch.cuda.MemPool = MemPool
        torch.cuda.device = _Device
        torch.cuda.device_count = lambda: 2
    torch.made = made
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def test_the_c_callbacks_allocate_free_and_refuse_like_pytorch_expects(sim, monkeypatch):
    torch = _fake_torch(monkeypatch)
    import mrkit.torch as mt
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource()), 8 << 20)
    a = mt.allocator(mr)
    c_alloc, c_free = torch.made[-1]
    s = Stream.create()
    p = c_alloc(1 << 20, 0, s.handle)  # PyTorch: size, device, cudaStream_t
    q = c_alloc(3000, 0, None)  # the default stream
    assert p and q and a.live_bytes == (1 << 20) + 3000 and mr.used_bytes == (1 << 20) + 3000
    sim.touch(p, 1 << 20, s.handle)  # PyTorch's kernel on its stream
    assert c_alloc(64 << 20, 0, s.handle) is None  # NULL: PyTorch frees its cache and retries or raises
    assert a.failures == 1 and isinstance(a.last_error, mrkit.OutOfMemoryError)
    assert c_alloc(100, 1, None) is None and "device 1" in str(a.last_error)  # not this resource's device
    c_free(p, 1 << 20, 0, s.handle)
    c_free(q, 3000, 0, None)
    c_free(0xdead000, 64, 0, None)  # a pointer never handed out: counted, never raised into C
    mt.apply_queued_frees()  # ctypes calls without the GIL: the compiled build may have queued them
    assert a.live_bytes == 0 and mr.used_bytes == 0 and a.foreign_frees == 1


def test_install_and_pool_fail_clearly_without_pytorchs_internals(sim, monkeypatch):
    _fake_torch(monkeypatch, internals=False)
    import mrkit.torch as mt
    with pytest.raises(RuntimeError, match=r"no torch\.cuda\.MemPool"):
        mt.install()
    with pytest.raises(RuntimeError, match=r"no torch\._C\._cuda_customAllocator"):
        mt.allocator()
    with pytest.raises(RuntimeError, match=r"no torch\._C\._cuda_customAllocator|no torch\.cuda\.MemPool"):
        with mt.pool():
            pass
    torch = _fake_torch(monkeypatch)
    del torch.cuda.MemPool
    with pytest.raises(RuntimeError, match=r"no torch\.cuda\.MemPool"):
        with mt.pool():
            pass


def test_install_routes_every_device_to_a_mempool_of_mrkit(sim, monkeypatch):
    torch = _fake_torch(monkeypatch)
    import mrkit.torch as mt
    a = mt.install()  # every device: one MemPool each, all allocations of the device routed to it
    assert [m for m in torch.made if m[0] == "routed"] == [("routed", 0, a.pools[0].id), ("routed", 1, a.pools[1].id)]
    assert all(p.raw is a.allocator and p.mrkit is a for p in a.pools)
    one = mt.install(PoolResource(DeviceMemoryResource()))  # one resource: its own device only
    assert [p.id for p in one.pools] == [torch.made[-1][2]] and torch.made[-1][1] == 0
    with pytest.raises(TypeError, match="mr must be"):
        mt.allocator("pool(device)")


def test_the_callbacks_from_several_threads_with_release_beside_them_lose_nothing(sim, monkeypatch):
    import threading
    torch = _fake_torch(monkeypatch)
    import mrkit.torch as mt
    from mrkit import CudaMemoryResource
    pool = PoolResource(CudaMemoryResource())
    a = mt.allocator(pool)
    c_alloc, c_free = torch.made[-1]
    streams = [Stream.create() for _ in range(4)]
    stop, errors, seen_live = threading.Event(), [], set()
    seen_lock = threading.Lock()

    def worker(k):
        try:
            s = streams[k]
            held = []
            for i in range(400):
                p = c_alloc(256 * (1 + (i * 7 + k) % 50), 0, s.handle)
                assert p
                with seen_lock:  # never handed out twice while live
                    assert p not in seen_live
                    seen_live.add(p)
                held.append((p, 256 * (1 + (i * 7 + k) % 50)))
                if len(held) > 8:
                    q, n = held.pop(0)
                    with seen_lock:
                        seen_live.discard(q)
                    c_free(q, n, 0, s.handle)
            for q, n in held:
                with seen_lock:
                    seen_live.discard(q)
                c_free(q, n, 0, s.handle)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def releaser():
        while not stop.is_set():
            pool.release()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    rel = threading.Thread(target=releaser)
    rel.start()
    [t.start() for t in threads]
    [t.join() for t in threads]
    stop.set()
    rel.join()
    assert not errors, errors
    mt.apply_queued_frees()  # the workers' frees ran without the GIL: the compiled build queued some
    assert a.live_bytes == 0 and a.failures == 0 and a.foreign_frees == 0 and pool.live_bytes == 0
    for s in streams:
        s.synchronize()
    pool.release()
    assert pool.pool_size == 0 and sim.mem_get_info(0)[0] == sim.mem_get_info(0)[1]  # every byte upstream


@pytest.mark.parametrize("has_new", [True, False])
@pytest.mark.parametrize("queues", [True, False])
def test_the_settings_use_pytorchs_current_name_and_keep_the_users_own(has_new, queues, monkeypatch):
    """PyTorch 2.11 deprecates torch.cuda.memory._set_allocator_settings (a FutureWarning, which the
    H200 run turned into a failure of example 13): the accelerator-wide setter comes first. The
    user's PYTORCH_CUDA_ALLOC_CONF is restated (a settings call may reset what it does not name);
    max_split_size_mb only where frees are queued (the compiled build) and the user set none."""
    from mrkit.integrations.torch import RELEASE_SPLIT_MB, _configure
    calls = []
    torch = types.SimpleNamespace(_C=types.SimpleNamespace(), cuda=types.SimpleNamespace(memory=types.SimpleNamespace(
        _set_allocator_settings=lambda s: calls.append(("old", s)))))
    if has_new:
        torch._C._accelerator_setAllocatorSettings = lambda s: calls.append(("new", s))
    alloc = types.SimpleNamespace(queues_frees=queues)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    _configure(torch, alloc)
    split = f",max_split_size_mb:{RELEASE_SPLIT_MB}" if queues else ""
    assert calls == [("new" if has_new else "old", "release_lock_on_cudamalloc:True" + split)]
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,garbage_collection_threshold:0.6")
    _configure(torch, alloc)
    assert calls[-1][1] == "max_split_size_mb:128,garbage_collection_threshold:0.6,release_lock_on_cudamalloc:True"


def test_a_free_without_the_gil_is_queued_never_waited_for_and_applied_before_the_next_allocation(sim, monkeypatch):
    """PyTorch gives cached segments back under its allocator lock, from a thread that may not hold the
    GIL; a thread holding the GIL may be waiting for that lock (freeing a tensor). The compiled
    build's free callback therefore queues such a free instead of taking the GIL: the worker's call
    returns having applied nothing, and the free is applied once, on a thread that holds the GIL (the
    main thread's pending call, or the next allocation, which drains the queue first: the retry after
    PyTorch's release must see the memory back)."""
    import threading
    from mrkit._engine import core_name
    if core_name() != "compiled":
        pytest.skip("the Python build's ctypes callbacks always take the GIL (nothing is queued)")
    torch = _fake_torch(monkeypatch)
    import mrkit.torch as mt
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource()), 8 << 20)
    a = mt.allocator(mr)
    assert a.queues_frees  # runs before the test below gives every C slot out
    c_alloc, c_free = torch.made[-1]
    applied = []
    real_free = a.free

    def free(ptr, size, device, stream):
        applied.append(threading.get_ident())
        real_free(ptr, size, device, stream)
    a.free = free
    p = c_alloc(8 << 20, 0, None)
    assert p and c_alloc(1 << 20, 0, None) is None  # the limit is reached
    seen = []
    t = threading.Thread(target=lambda: (c_free(p, 8 << 20, 0, None), seen.append(threading.get_ident())))
    t.start()
    t.join()
    mt.apply_queued_frees()
    assert len(applied) == 1 and applied[0] != seen[0]  # applied once, and not by the worker that freed
    q = c_alloc(8 << 20, 0, None)  # the whole limit is free again
    assert q and a.live_bytes == 8 << 20
    # a queued free is applied before the next allocation: the retry sees the memory back at once
    t = threading.Thread(target=lambda: c_free(q, 8 << 20, 0, None))
    t.start()
    t.join()
    r = c_alloc(8 << 20, 0, None)
    assert r and len(applied) == 2 and mr.used_bytes == 8 << 20
    c_free(r, 8 << 20, 0, None)
    mt.apply_queued_frees()
    assert a.live_bytes == 0 and mr.used_bytes == 0 and mt.apply_queued_frees() == 0


def test_the_compiled_build_hands_pytorch_c_functions_of_its_own_and_ctypes_past_its_slots(sim, monkeypatch):
    """Compiled build: each allocator gets a pair of the extension's C functions (no ctypes
    trampoline) until its 64 pairs are given out; then ctypes. Python build: ctypes. Either way the
    pair PyTorch receives serves the allocator it was made for."""
    torch = _fake_torch(monkeypatch)
    import mrkit.torch as mt
    from mrkit._engine import core_name
    mr = PoolResource(DeviceMemoryResource())
    s = Stream.create()
    kinds = []
    for _ in range(66):
        a = mt.allocator(mr)
        kinds.append("ctypes" if hasattr(a, "_c_alloc") else "c")
        c_alloc, c_free = torch.made[-1]
        ptr = c_alloc(4096, 0, s.handle)
        assert ptr and a.live_bytes == 4096
        c_free(ptr, 4096, 0, s.handle)
        mt.apply_queued_frees()
        assert a.live_bytes == 0 and a.foreign_frees == 0
    if core_name() == "compiled":
        assert kinds[0] == "c" and kinds[-1] == "ctypes"  # 64 slots a process: some went to earlier tests
        assert kinds == sorted(kinds)  # C functions first, then ctypes for good
    else:
        assert set(kinds) == {"ctypes"}
    assert mr.live_bytes == 0



def test_what_pytorch_may_call_late_is_kept_through_the_interpreters_exit(sim, monkeypatch):
    """A pytest process that had used pool() through ctypes callbacks crashed at exit (segmentation
    fault while collecting garbage): PyTorch may call the callbacks when a MemPool is freed, however
    late. The allocator, its ctypes callbacks and every MemPool go through _keep_forever, which keeps
    an object alive even once the module's list is torn down."""
    import gc
    import weakref
    torch = _fake_torch(monkeypatch)
    import mrkit.integrations.torch as it
    import mrkit.torch as mt
    from mrkit._engine import python_core

    class Thing:
        pass
    t = Thing()
    ref = weakref.ref(t)
    n = len(it._keep)
    it._keep_forever(t)
    del it._keep[n:]  # what the interpreter's teardown does to the module's globals
    del t
    gc.collect()
    assert ref() is not None  # one reference no teardown drops

    from contextlib import nullcontext
    torch.cuda.use_mem_pool = lambda pool, device=None: nullcontext()
    kept = []
    monkeypatch.setattr(it, "_keep_forever", kept.append)
    with python_core():  # the Python build's route: ctypes callbacks
        a = mt.allocator(PoolResource(DeviceMemoryResource()))
        with mt.pool(PoolResource(DeviceMemoryResource())) as mp:
            pass
        b = mt.install(PoolResource(DeviceMemoryResource()))
    assert not a.queues_frees
    ids = {id(x) for x in kept}
    assert {id(a), id(a._c_alloc), id(a._c_free), id(mp), id(mp.mrkit), id(b), id(b.pools)} <= ids
