"""The ``mrkit`` command: ``mrkit info``, ``mrkit demo`` and ``mrkit replay``."""
from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from importlib import metadata

from ._errors import CUDAUnavailableError, StreamOrderViolation
from ._sizes import format_size

__all__ = ["main"]


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def _describe_devices(drv, out) -> None:
    n = drv.device_count()
    print(f"  devices: {n}", file=out)
    for dev in range(n):
        def cap(name, dev=dev):
            return drv.device_capability(dev, name)
        free, total = drv.mem_get_info(dev)
        print(f"  [{dev}] {drv.device_name(dev)}", file=out)
        print(f"      memory: {format_size(total)} total, {format_size(free)} free", file=out)
        print(f"      compute capability: {cap('compute_capability_major')}.{cap('compute_capability_minor')}, "
              f"{cap('multiprocessor_count')} multiprocessors", file=out)
        pools = bool(cap("memory_pools_supported"))
        print(f"      memory pools (stream-ordered allocator): {'yes' if pools else 'no'}", file=out)
        if pools:
            pool = drv.device_get_mem_pool(dev)
            thr = drv.mem_pool_get_attribute(pool, "release_threshold")
            print(f"        current pool release threshold: {thr}", file=out)
        vmm = bool(cap("virtual_memory_management_supported"))
        line = "yes" if vmm else "no"
        if vmm:
            g = drv.mem_get_allocation_granularity(dev)
            r = drv.mem_get_allocation_granularity(dev, recommended=True)
            line += f" (granularity {format_size(g)}, recommended {format_size(r)})"
        print(f"      virtual memory management: {line}", file=out)
        print(f"      managed memory: {'yes' if cap('managed_memory') else 'no'}, concurrent managed access: "
              f"{'yes' if cap('concurrent_managed_access') else 'no'}", file=out)
        print(f"      unified addressing: {'yes' if cap('unified_addressing') else 'no'}", file=out)


def _runtime_version(cuda) -> str:
    v = cuda.runtime_version()
    return "unavailable" if v is None else f"{v // 1000}.{v % 1000 // 10}"


def cmd_info(args, out=None) -> int:
    out = out or sys.stdout
    from . import __version__
    from .driver import CudaDriver, SimDriver, get_driver

    print(f"mrkit {__version__} on Python {platform.python_version()} "
          f"(cuda-bindings {_version('cuda-bindings')}, numpy {_version('numpy')}, cupy "
          f"{_version('cupy-cuda13x') if _version('cupy-cuda13x') != 'not installed' else _version('cupy-cuda12x')})",
          file=out)
    drv = get_driver()
    print(f"backend in use: {drv.name} (choose with MRKIT_BACKEND=cuda|sim)", file=out)
    cuda = drv if isinstance(drv, CudaDriver) else CudaDriver()
    try:
        v = cuda.driver_version()
        print(f"CUDA driver: {v // 1000}.{v % 1000 // 10} (runtime {_runtime_version(cuda)})", file=out)
        _describe_devices(cuda, out)
        has_gpu = cuda.device_count() > 0
    except CUDAUnavailableError as exc:
        print(f"CUDA driver: none — {exc.explanation}", file=out)
        has_gpu = False
    if not has_gpu or isinstance(drv, SimDriver):
        sim = drv if isinstance(drv, SimDriver) else SimDriver()
        print("No GPU in use: mrkit runs here on its simulated backend (MRKIT_BACKEND=sim):", file=out)
        _describe_devices(sim, out)
    return 0


def _demo_driver(backend: str | None):
    from .driver import CudaDriver, SimDriver

    if backend == "sim":
        return SimDriver(policy="random", seed=7)
    drv = CudaDriver()
    try:
        if drv.device_count() > 0:
            return drv
    except CUDAUnavailableError:
        if backend == "cuda":
            raise
    return SimDriver(policy="random", seed=7)


def cmd_demo(args, out=None) -> int:
    """Run a multi-stream workload through statistics(pool(device)) and show the race checker."""
    out = out or sys.stdout
    from . import DeviceMemoryResource, PoolResource, StatisticsAdaptor, Stream
    from .driver import SimDriver, use_backend

    drv = _demo_driver(args.backend)
    print(f"mrkit demo on the {drv.name} backend ({drv.device_name(0)})", file=out)
    with use_backend(drv):
        pool = PoolResource(DeviceMemoryResource(0, driver=drv))
        mr = StatisticsAdaptor(pool)
        streams = [Stream.create(0, driver=drv) for _ in range(4)]
        rng = random.Random(0)
        live = []
        t0 = time.perf_counter()
        ops = 0
        for i in range(args.ops):
            s = streams[i % len(streams)]
            if live and rng.random() < 0.45:
                p, n, owner = live.pop(rng.randrange(len(live)))
                mr.deallocate(p, n, owner)
            else:
                n = int(2 ** rng.uniform(8, 22))
                p = mr.allocate(n, s)
                drv.touch(p, n, s.handle)  # a kernel writing the block, checked on the simulator
                live.append((p, n, s))
            ops += 1
        for p, n, owner in live:
            mr.deallocate(p, n, owner)
        for s in streams:
            s.synchronize()
        dt = time.perf_counter() - t0
        st = mr.statistics
        print(f"  {ops} allocate/free calls on {len(streams)} streams in {dt * 1e3:.1f} ms "
              f"({dt * 1e6 / ops:.1f} us per call, kernels included)", file=out)
        print(f"  peak live {format_size(st.peak_bytes)} in at most {st.peak_count} blocks; "
              f"{st.total_count} allocations, {format_size(st.total_bytes)} in all", file=out)
        print(f"  the pool held {format_size(pool.pool_size)} from the device pool; "
              f"release() gave back {format_size(pool.release())}", file=out)
        for s in streams:
            s.close()
        if isinstance(drv, SimDriver):
            print("  stream-order checker: a naive pool that hands a block freed on stream A to stream B", file=out)
            a, b = Stream.create(0, driver=drv), Stream.create(0, driver=drv)
            p = drv.mem_alloc(0, 1 << 20)
            drv.touch(p, 1 << 20, a.handle)       # A's kernel still uses the block...
            try:
                drv.touch(p, 1 << 20, b.handle)   # ...when B's kernel reuses it without a wait
                print("  NOT caught (this is a bug in mrkit)", file=out)
                return 1
            except StreamOrderViolation as exc:
                print("  was caught deterministically:", file=out)
                print("    " + str(exc).splitlines()[0][:160], file=out)
            drv.stream_synchronize(a.handle)
            drv.mem_free(p)
    return 0


def cmd_replay(args, out=None) -> int:
    """Replay an allocation log (ours or RMM's) against resource specs and compare them."""
    out = out or sys.stdout
    from ._spec import resource_from_spec
    from .adaptors import StatisticsAdaptor, read_log, replay

    drv = _demo_driver(args.backend)
    events = read_log(args.log)
    print(f"{len(events)} events from {args.log} on the {drv.name} backend", file=out)
    print("| resource | us/event | peak live | held at the end | failures |", file=out)
    print("|---|---|---|---|---|", file=out)
    from .driver import use_backend
    with use_backend(drv):
        for spec in args.resource:
            mr = resource_from_spec(spec, drv)
            stats = mr if isinstance(mr, StatisticsAdaptor) else None
            r = replay(events, mr, driver=drv)
            held = "-" if r.held_bytes is None else format_size(r.held_bytes)
            print(f"| {spec} | {r.us_per_event:.2f} | {format_size(r.peak_live_bytes)} | {held} | {r.failures} |",
                  file=out)
            if stats is not None:
                print(f"|   statistics | | peak {format_size(stats.statistics.peak_bytes)} | | |", file=out)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="mrkit", description="Stream-ordered memory resources for CUDA.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, devices and the capabilities mrkit uses")
    demo = sub.add_parser("demo", help="run a multi-stream workload through a pool (GPU, else simulator)")
    demo.add_argument("--backend", choices=["cuda", "sim"], default=None,
                      help="force a backend (default: the GPU if there is one, else the simulator)")
    demo.add_argument("--ops", type=int, default=2000, help="allocate/free calls to make")
    rep = sub.add_parser("replay", help="replay an allocation log (mrkit's or RMM's CSV) against resources")
    rep.add_argument("log", help="the CSV log (Thread,Time,Action,Pointer,Size,Stream)")
    rep.add_argument("--resource", action="append", default=None,
                     help="a resource spec, e.g. 'pool(device)'; repeat to compare (default: device, pool(device))")
    rep.add_argument("--backend", choices=["cuda", "sim"], default=None,
                     help="force a backend (default: the GPU if there is one, else the simulator)")
    args = parser.parse_args(argv)
    if args.command == "replay" and not args.resource:
        args.resource = ["device", "pool(device)"]
    try:
        return {"info": cmd_info, "demo": cmd_demo, "replay": cmd_replay}[args.command](args)
    except BrokenPipeError:  # `mrkit info | head`: the reader left; that is not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
