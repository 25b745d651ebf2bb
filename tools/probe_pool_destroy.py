"""Whether the driver survives a free into a pool destroyed under a live block, on this GPU: each case in
its own process (a crash is its exit status), with cuda.bindings alone (no mrkit).

    python tools/probe_pool_destroy.py        (prints one line per case: its name and exit status)

Cases: ``free_after_destroy`` (allocate, cuMemPoolDestroy, cuMemFreeAsync, cuCtxSynchronize), ``pending_free``
(allocate, cuMemFreeAsync, cuMemPoolDestroy at once, cuCtxSynchronize), ``control`` (allocate, free,
synchronise, destroy, synchronise); each ``+attrs`` case first sets the attributes mrkit's
``DeviceMemoryResourceOptions()`` sets (release threshold 2**64-1, the three reuse policies), and
``+sync_between`` synchronises between destroy and free as the crashing test's ``mr.trim`` did.
Run 96 (H100) ran the first three without ``+attrs``: all exit 0."""
import subprocess
import sys


def case(name: str) -> None:
    from cuda.bindings import driver as d
    ok = lambda r: r[1] if isinstance(r, tuple) and len(r) > 1 else None  # noqa: E731
    assert d.cuInit(0)[0] == 0
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    d.cuCtxSetCurrent(ctx)
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = ok(d.cuMemPoolCreate(props))
    if "+attrs" in name:
        a = d.CUmemPool_attribute
        d.cuMemPoolSetAttribute(pool, a.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, d.cuuint64_t((1 << 64) - 1))
        for attr in (a.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, a.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                     a.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES):
            d.cuMemPoolSetAttribute(pool, attr, 1)
    ptr = ok(d.cuMemAllocFromPoolAsync(5000, pool, 0))
    if name.startswith("free_after_destroy"):
        print("destroy", d.cuMemPoolDestroy(pool)[0], flush=True)
        if "+sync_between" in name:
            print("sync between", d.cuCtxSynchronize()[0], flush=True)
        print("free", d.cuMemFreeAsync(ptr, 0)[0], flush=True)
    elif name.startswith("pending_free"):
        print("free", d.cuMemFreeAsync(ptr, 0)[0], "destroy", d.cuMemPoolDestroy(pool)[0], flush=True)
    else:
        d.cuMemFreeAsync(ptr, 0)
        d.cuCtxSynchronize()
        print("destroy", d.cuMemPoolDestroy(pool)[0], flush=True)
    print("sync", d.cuCtxSynchronize()[0], flush=True)
    ptr = ok(d.cuMemAllocAsync(100, 0))  # the device still works
    d.cuMemFreeAsync(ptr, 0)
    print("sync again", d.cuCtxSynchronize()[0], flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        case(sys.argv[1])
    else:
        for name in ("control", "pending_free", "free_after_destroy", "control+attrs", "pending_free+attrs",
                     "free_after_destroy+attrs", "free_after_destroy+attrs+sync_between"):
            r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, timeout=60)
            print(f"{name}: exit {r.returncode}; {' | '.join(r.stdout.split(chr(10)))[:200]} {r.stderr.strip()[-200:]}")
