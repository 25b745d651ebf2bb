"""PyTorch with mrkit on a real GPU, one case per process (``python tests/gpu_torch_cases.py CASE``):
process-wide installation needs a fresh process, and a lock-order deadlock must hang only its own
process, which tests/test_gpu_torch.py then reports. Each case prints ``ok`` and facts on success."""
from __future__ import annotations

import contextlib
import sys
import threading

import torch

import mrkit.torch as mt
from mrkit import DeviceMemoryResource, LimitingAdaptor, PoolResource, StatisticsAdaptor


def _train(steps: int = 12, threads_backward: bool = False) -> list[float]:
    """A small MLP's losses over ``steps`` SGD steps from a fixed seed (deterministic on one GPU)."""
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(1024, 256, device="cuda")
    y = torch.randint(0, 10, (1024,), device="cuda")
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # autograd runs the backward pass on its own device thread
        opt.step()
        losses.append(float(loss))
    return losses


def case_training_same_loss_in_a_pool():
    want = _train()
    mr = StatisticsAdaptor(PoolResource(DeviceMemoryResource(0)))
    with mt.pool(mr) as mp:
        got = _train()
        stats = torch.cuda.memory_stats()  # PyTorch's own statistics keep working
    assert got == want, (got, want)
    assert mr.statistics.total_count > 0 and mp.mrkit.live_bytes > 0
    assert stats["allocated_bytes.all.peak"] > 0
    print(f"ok losses equal over {len(got)} steps; mrkit supplied {mr.statistics.total_count} segments")


def case_training_same_loss_installed():
    a = mt.install(StatisticsAdaptor(PoolResource(DeviceMemoryResource(0))))
    got = _train()
    # PyTorch's caching allocator sits in front (segments from mrkit), so its statistics count every
    # tensor while mrkit sees the segments: every byte PyTorch reserved came from mrkit
    reserved = torch.cuda.memory_stats()["reserved_bytes.all.current"]
    assert a.resource.statistics.total_count >= 1 and a.failures == 0
    assert a.live_bytes == reserved > 0 and torch.cuda.memory_stats()["allocation.all.allocated"] > 50
    print("ok", ",".join(f"{v:.9g}" for v in got))  # compared by the test with PyTorch's own run


def case_training_reference():
    print("ok", ",".join(f"{v:.9g}" for v in _train()))


def _stress(in_pool: bool, n: int = 3000) -> None:
    """Two threads: one allocating tensors (through mrkit: PyTorch holds its allocator lock and then
    needs the GIL for mrkit's callback), one dropping them while holding the GIL (PyTorch's free then
    needs its allocator lock): the lock-order hazard of pytorch 97833."""
    errors, made = [], []
    ready = threading.Barrier(2)
    mp = torch.cuda.MemPool(mt.allocator(PoolResource(DeviceMemoryResource(0))).allocator) if in_pool else None

    def allocating():
        try:
            ready.wait()
            with torch.cuda.use_mem_pool(mp) if mp is not None else contextlib.nullcontext():
                for i in range(n):
                    made.append(torch.empty((i % 97 + 1) * 4096, dtype=torch.uint8, device="cuda"))
                    if i % 64 == 63:
                        torch.cuda.empty_cache()  # segments go back to mrkit too
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def freeing():
        try:
            ready.wait()
            for _ in range(4 * n):
                try:
                    made.pop(0)  # the last reference: freed here, with the GIL held
                except IndexError:
                    pass
        except Exception as exc:  # pragma: no cover
            errors.append(exc)
    ts = [threading.Thread(target=allocating), threading.Thread(target=freeing)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    made.clear()
    torch.cuda.synchronize()
    assert not errors, errors


def case_two_threads_pool():
    _stress(True)
    print("ok two threads, mrkit pool under torch.cuda.MemPool: no deadlock")


def case_two_threads_installed():
    mt.install()
    _stress(False)
    print("ok two threads, mrkit installed process-wide: no deadlock")


def case_oom_is_typed():
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), 64 << 20)
    try:
        with mt.pool(mr) as mp:
            small = torch.ones(1 << 20, device="cuda")
            torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as exc:
        notes = getattr(exc, "__notes__", [])
        assert sys.version_info < (3, 11) or any(n.startswith("mrkit:") for n in notes), notes
    else:
        raise AssertionError("no OutOfMemoryError")
    assert float(small.sum()) == float(1 << 20) and mp.mrkit.failures >= 1  # the pool still works
    print("ok torch.cuda.OutOfMemoryError with mrkit's reason:", notes[-1][:120] if notes else "")


def case_install_after_pytorch_allocated():
    early = torch.ones(10, device="cuda")
    a = mt.install()
    late = torch.ones(1 << 20, device="cuda")
    assert a.live_bytes >= 4 << 20 and float(early.sum()) == 10.0 and float(late.sum()) == float(1 << 20)
    del early
    torch.cuda.synchronize()
    print("ok install() after PyTorch's first allocation routes new tensors, old ones stay valid")


def case_install_refusal_is_typed_never_null():
    """mrkit refusing under install() was a tensor with data_ptr() == 0; writing it lost the context."""
    a = mt.install(LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), 1 << 30))
    try:
        t = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        pass
    else:
        raise AssertionError(f"no OutOfMemoryError; data_ptr {t.data_ptr()}")
    assert a.failures >= 1
    y = torch.ones(100 << 20, dtype=torch.uint8, device="cuda")  # memory is still usable afterwards
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("t", torch.full((1 << 20,), 2.0, device="cuda")))
    th.start()
    th.join()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = torch.full((1 << 20,), 3.0, device="cuda")
    s.synchronize()
    assert int(y.sum()) == 100 << 20 and float(out["t"].sum()) == 2.0 * (1 << 20) and float(z.sum()) == 3.0 * (1 << 20)
    assert a.live_bytes >= (100 << 20) + (8 << 20)  # every thread's and stream's tensors came from mrkit
    print("ok install(): a refusal is torch.cuda.OutOfMemoryError, every thread and stream routed")


def case_cupy_and_torch_share_one_pool():
    import cupy
    import mrkit.cupy
    mr = StatisticsAdaptor(PoolResource(DeviceMemoryResource(0)))
    mrkit.cupy.install(mr)
    mt.install(mr)
    c = cupy.arange(1 << 20, dtype=cupy.float32)
    t = torch.from_dlpack(c)  # zero-copy both ways
    assert t.data_ptr() == c.data.ptr
    t += 1
    assert float(c[5]) == 6.0
    u = torch.full((1000,), 3.0, device="cuda")
    v = cupy.from_dlpack(u)
    assert v.data.ptr == u.data_ptr() and float(v.sum()) == 3000.0
    assert mr.statistics.current_bytes >= (4 << 20) + 4000  # both libraries' arrays in the one pool
    print(f"ok one pool, {mr.statistics.current_count} live blocks from CuPy and PyTorch")


def _fill_free_refill(tensor_mib: int = 64, big_mib: int = 200) -> int:
    """Tensors of ``tensor_mib`` until OutOfMemoryError, all freed, then one of ``big_mib`` written
    and read back; the number that fitted."""
    held = []
    try:
        while len(held) < 1000:
            held.append(torch.empty(tensor_mib << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        pass
    n = len(held)
    assert 0 < n < 1000, n
    del held
    big = torch.empty(big_mib << 20, dtype=torch.uint8, device="cuda")
    big.fill_(7)
    probe = big[::4096]  # a strided view: checking it allocates kilobytes, not another 200 MiB
    assert int(big[-1]) == 7 and int(probe.sum(dtype=torch.int64)) == 7 * probe.numel()
    del big, probe
    return n


def _short_release_round() -> bool:
    """Cached segments that add up to less than the request: a small tensor stays alive, so only 3 x
    64 MiB fit; freed, they are 192 MiB against a request of 200 MiB. PyTorch gives all three back
    (``release_available_cached_blocks``), finds them short and, inside a MemPool, raises without
    retrying; the memory is back in mrkit by then, so the next attempt fits. Returns whether the first
    attempt raised."""
    pin = torch.ones(16, device="cuda")
    held = []
    try:
        while len(held) < 1000:
            held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        pass
    assert 0 < len(held) < 1000
    del held
    try:
        big = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")
        raised = False
    except torch.cuda.OutOfMemoryError:
        raised = True
        big = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")  # the released segments are back
    big.fill_(5)
    assert int(big[-1]) == 5 and float(pin.sum()) == 16.0
    del big, pin
    return raised


def _pool_segments(mp) -> int:
    return sum(seg["total_size"] for seg in mp.snapshot())


def case_pool_under_limit_gives_cached_segments_back():
    """Issue 32: under pool(LimitingAdaptor(..., 256 MiB)) 64 MiB tensors to OOM, all freed, then 200 MiB
    raised OOM again: the segments stayed cached in PyTorch's MemPool. PyTorch's own allocator under
    the same limit (set_per_process_memory_fraction) fits it; so must mrkit's pool."""
    limit = 256 << 20
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total)
    theirs = _fill_free_refill()  # PyTorch's own allocator, for comparison
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), limit)
    from mrkit._engine import core_name
    if core_name() != "compiled":  # documented: the Python build's ctypes free must take the GIL
        try:
            with mt.pool(mr):
                _fill_free_refill()
        except torch.cuda.OutOfMemoryError:
            print("ok Python build: the cached segments stay in PyTorch's pool (documented)")
            return
        raise AssertionError("the Python build fitted 200 MiB: update the docs")
    with mt.pool(mr) as mp:
        ours = _fill_free_refill()  # the pattern in a fresh pool: 4 x 64 MiB, then 200 MiB
        # again with 50 MiB tensors: the 200 MiB segment cached from the first round goes back too
        ours_again = _fill_free_refill(50)
        first_raised = _short_release_round()
    mt.apply_queued_frees()
    a = mp.mrkit
    # every byte mrkit counts is a segment PyTorch holds in the pool, and the limit held throughout
    assert a.live_bytes == mr.used_bytes == _pool_segments(mp) <= limit, (a.live_bytes, mr.used_bytes, _pool_segments(mp))
    assert a.failures >= 2 and a.foreign_frees == 0
    print(f"ok PyTorch's own fitted {theirs} x 64 MiB then 200 MiB; mrkit's pool {ours} x 64 and {ours_again} x 50 MiB "
          f"then 200 MiB each time ({a.failures} refusals given back by PyTorch's cache); with cached segments "
          f"short of the request the first 200 MiB attempt {'raised' if first_raised else 'fitted'} and the next fitted")


def case_pool_under_limit_without_release_keeps_the_old_failure():
    """The same pattern with mrkit's setting turned off (RELEASE_SPLIT_MB = None): PyTorch keeps the
    freed segments cached in the MemPool and the 200 MiB tensor is refused, the failure issue 32
    reported. Shows that the case above tests the setting."""
    import mrkit.integrations.torch as it
    it.RELEASE_SPLIT_MB = None
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), 256 << 20)
    try:
        with mt.pool(mr):
            _fill_free_refill()
    except torch.cuda.OutOfMemoryError:
        print("ok without the setting the 200 MiB tensor is refused (the cached segments stay in the pool)")
    else:
        raise AssertionError("the 200 MiB tensor fitted without the setting")


def case_pool_under_limit_with_a_thread_freeing_beside_it():
    """PyTorch gives cached segments back under its allocator lock, from the allocating thread, which
    has released the GIL; a thread freeing tensors holds the GIL and waits for that lock. mrkit's free
    callback must not wait for the GIL there (a deadlock): it queues the free. Conservation at the end."""
    from mrkit._engine import core_name
    if core_name() != "compiled":
        print("ok Python build: no segments are given back on OOM, so no free runs under PyTorch's lock")
        return
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), 256 << 20)
    stop, errors, made = threading.Event(), [], []

    def freeing():
        try:
            while not stop.is_set():
                made.append(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))  # PyTorch's own pool
                while len(made) > 4:
                    made.pop(0)  # freed here, with the GIL held: PyTorch's free takes its lock
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    t = threading.Thread(target=freeing)
    t.start()
    try:
        with mt.pool(mr) as mp:
            fitted = [_fill_free_refill(50) for _ in range(20)]
    finally:
        stop.set()
        t.join()
    made.clear()
    mt.apply_queued_frees()
    assert not errors, errors
    a = mp.mrkit
    assert a.live_bytes == mr.used_bytes == _pool_segments(mp) <= 256 << 20 and a.foreign_frees == 0
    print(f"ok 20 rounds beside a freeing thread, no deadlock; fitted {sorted(set(fitted))} x 50 MiB")


def case_python_build_pool_exits_silently():
    """The Python build (and an allocator past the 64 C slots) hands PyTorch ctypes callbacks. PyTorch
    may call them while the interpreter shuts down (a MemPool freed at exit gives its segments back):
    they must still exist then. Run with MRKIT_NO_EXTENSIONS=1; the test checks the exit status and
    that nothing was printed to stderr."""
    from mrkit._engine import core_name
    assert core_name() == "python", core_name()
    mr = LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), 256 << 20)
    with mt.pool(mr) as mp:
        x = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
        y = torch.ones(1 << 20, device="cuda")
    assert not mp.mrkit.queues_frees and int(x[-1]) == 1 and float(y.sum()) == float(1 << 20)
    del x
    print("ok the Python build's pool, tensors alive at exit")


if __name__ == "__main__":
    globals()["case_" + sys.argv[1]]()
