"""Probe PyTorch's allocator internals that mrkit.torch relies on (run on the GPU machine, one case per
process: python3 tools/probe_torch.py CASE). Prints what it finds; never writes to a null tensor."""
import sys
import threading

import torch

import mrkit
import mrkit.torch as mt

MiB = 1 << 20
case = sys.argv[1]
if case == "names":
    print("torch", torch.__version__)
    print([n for n in dir(torch._C) if "Pool" in n or "emptyCache" in n or "oom" in n.lower() or "Allocator" in n])
    print("MemPool:", [n for n in dir(torch.cuda.MemPool) if not n.startswith("__")])
    import inspect
    print("empty_cache:", inspect.signature(torch.cuda.empty_cache))
elif case == "install_now":
    a = mt.install(mrkit.LimitingAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)), "1 GiB"))
    try:
        t = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        print("install_now: no error, data_ptr", t.data_ptr())
    except Exception as exc:
        print("install_now: raised", type(exc).__name__, str(exc)[:200])
elif case == "routed":
    a = mt.allocator(mrkit.LimitingAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)), "1 GiB"))
    mp = torch.cuda.MemPool(a.allocator)
    torch._C._cuda_beginAllocateToPool(0, mp.id)
    try:
        t = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        print("routed: no error, data_ptr", t.data_ptr())
    except Exception as exc:
        print("routed: raised", type(exc).__name__, str(exc)[:200])
    y = torch.ones(100 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("routed: after OOM, 100 MiB tensor sum", int(y.sum()), "mrkit live", a.live_bytes)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("t", torch.ones(50 * MiB, dtype=torch.uint8, device="cuda")))
    th.start(); th.join()
    print("routed: other thread allocated; mrkit live", a.live_bytes)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = torch.ones(30 * MiB, dtype=torch.uint8, device="cuda")
    print("routed: other stream allocated; mrkit live", a.live_bytes)
elif case == "limit_retry":
    lim = mrkit.LimitingAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)), 256 * MiB)
    a = mt.allocator(lim)
    mp = torch.cuda.MemPool(a.allocator)
    with torch.cuda.use_mem_pool(mp):
        ts = []
        try:
            while True:
                ts.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            print(case, ": OOM after", len(ts), "tensors; mrkit used", lim.used_bytes)
        del ts
        torch.cuda.synchronize()
        try:
            big = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
            print(case, ": 200 MiB after freeing: OK; mrkit used", lim.used_bytes)
        except torch.cuda.OutOfMemoryError as exc:
            print(case, ": 200 MiB after freeing: OOM again; mrkit used", lim.used_bytes)
            torch.cuda.empty_cache()
            print(case, ": after empty_cache() mrkit used", lim.used_bytes)
            try:
                mp_cache = getattr(mp, "empty_cache", None)
                print("MemPool.empty_cache exists:", mp_cache is not None)
            except Exception as e:
                print(e)
