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
elif case.startswith("release_"):
    # which call, made from inside mrkit's refused alloc callback, gives the MemPool's cached segments
    # back so that a retry fits: release_empty (torch._C._cuda_emptyCache()), release_pool
    # (torch.cuda.empty_cache with the pool's id, where it takes one), release_mp (MemPool method)
    import inspect
    print("emptyCache doc:", (torch._C._cuda_emptyCache.__doc__ or "")[:300])
    print("MemPool:", [n for n in dir(torch.cuda.MemPool) if not n.startswith("__")])
    try:
        print("empty_cache sig:", inspect.signature(torch.cuda.memory.empty_cache))
    except Exception as e:
        print(e)
    lim = mrkit.LimitingAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)), 256 * MiB)
    a = mt.allocator(lim)
    mp = torch.cuda.MemPool(a.allocator)
    inner = a.alloc
    calls = []

    def alloc(size, device, stream):
        p = inner(size, device, stream)
        if p is None:
            calls.append(size)
            try:
                if case == "release_empty":
                    torch._C._cuda_emptyCache()
                elif case == "release_pool":
                    torch._C._cuda_emptyCache(mp.id)
                elif case == "release_mp":
                    mp.empty_cache()
            except Exception as e:
                print("release call raised", type(e).__name__, str(e)[:200])
            print("  in callback after release: mrkit used", lim.used_bytes)
            p = inner(size, device, stream)
        return p
    import ctypes
    import mrkit.integrations.torch as mit
    a._c_alloc = mit._ALLOC(alloc)
    a.allocator = torch._C._cuda_customAllocator(ctypes.cast(a._c_alloc, ctypes.c_void_p).value,
                                                 ctypes.cast(a._c_free, ctypes.c_void_p).value)
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
            big.fill_(3)
            torch.cuda.synchronize()
            print(case, ": 200 MiB after freeing: OK, sum", int(big[:10].sum()), "mrkit used", lim.used_bytes)
        except torch.cuda.OutOfMemoryError:
            print(case, ": 200 MiB after freeing: OOM again; mrkit used", lim.used_bytes)
    print(case, "stats reserved", torch.cuda.memory_reserved())
