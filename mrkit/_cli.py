"""The ``mrkit`` command: ``mrkit info``, ``demo``, ``replay`` and ``snapshot``."""
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


def _backend_story() -> tuple[str, str]:
    """(backend the process uses, why) without touching the GPU more than asking for its count."""
    import os

    from .driver import CudaDriver

    env = os.environ.get("MRKIT_BACKEND", "").strip().lower()
    if env == "sim":
        return "sim", "MRKIT_BACKEND=sim is set"
    try:
        n = CudaDriver().device_count()
    except CUDAUnavailableError as exc:
        return "none", f"MRKIT_BACKEND={env or 'cuda (default)'} but {exc.explanation}"
    if n == 0:
        return "none", "the CUDA driver is present but reports no device"
    return "cuda", ("MRKIT_BACKEND=cuda is set" if env == "cuda" else
                    f"a CUDA driver with {n} device{'s' if n != 1 else ''} is present (MRKIT_BACKEND unset)")


def _devices_json(drv) -> list[dict]:
    out = []
    for dev in range(drv.device_count()):
        free, total = drv.mem_get_info(dev)
        caps = {name: drv.device_capability(dev, name) for name in (
            "memory_pools_supported", "virtual_memory_management_supported", "managed_memory",
            "concurrent_managed_access", "compute_capability_major", "compute_capability_minor",
            "multiprocessor_count")}
        out.append({"index": dev, "name": drv.device_name(dev), "total_bytes": total, "free_bytes": free, **caps})
    return out


def cmd_info(args, out=None) -> int:
    out = out or sys.stdout
    from . import __version__
    from .driver import CudaDriver, SimDriver

    backend, why = _backend_story()
    if getattr(args, "json", False):
        import json
        drv = CudaDriver() if backend == "cuda" else SimDriver()
        data = {"mrkit": __version__, "python": platform.python_version(),
                "packages": {p: _version(p) for p in ("cuda-bindings", "numpy", "cupy-cuda13x", "cupy-cuda12x",
                                                      "torch", "rich")},
                "backend": "sim" if backend == "none" else backend, "reason": why,
                "driver_version": drv.driver_version(), "devices": _devices_json(drv)}
        print(json.dumps(data, indent=2), file=out)
        return 0
    print(f"mrkit {__version__} on Python {platform.python_version()} "
          f"(cuda-bindings {_version('cuda-bindings')}, numpy {_version('numpy')}, cupy "
          f"{_version('cupy-cuda13x') if _version('cupy-cuda13x') != 'not installed' else _version('cupy-cuda12x')})",
          file=out)
    if backend == "cuda":
        cuda = CudaDriver()
        print(f"backend in use: cuda, because {why}", file=out)
        v = cuda.driver_version()
        print(f"CUDA driver: {v // 1000}.{v % 1000 // 10} (runtime {_runtime_version(cuda)})", file=out)
        _describe_devices(cuda, out)
    else:
        print(f"backend in use: sim (the simulated CUDA device), because {why}", file=out)
        _describe_devices(SimDriver(), out)
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
    if backend == "cuda":
        raise CUDAUnavailableError("CUDA_NO_DEVICE", None, "cuDeviceGetCount", "the CUDA driver reports no device")
    return SimDriver(policy="random", seed=7)


def _progress(total: int, label: str, quiet: bool):
    """A rich progress bar where rich is installed and the output is a terminal or forced; a no-op
    otherwise. Returns (context manager, advance(n) function)."""
    import contextlib
    if quiet:
        return contextlib.nullcontext(), lambda n=1: None
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return contextlib.nullcontext(), lambda n=1: None
    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False)
    task = prog.add_task(label, total=total)
    return prog, lambda n=1: prog.advance(task, n)


def _table(title: str, rows: list[tuple[str, str]], out) -> None:
    """Two-column summary: a rich table when rich is installed, plain aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title, file=out)
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"  {k:<{width}}  {v}", file=out)
        return
    t = Table(title=title, title_justify="left")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    Console(file=out, width=100).print(t)


def demo_workload(drv, ops: int, seed: int = 0):
    """The demo's workload, sized to the device: sizes log-uniform from 256 B up to 4 MiB (less on a
    small device), live bytes capped at a quarter of the device's free memory; returns the plan as
    a list of ("a", size, stream index) / ("f", index of the allocation) steps."""
    free, _ = drv.mem_get_info(0)
    cap = max(1 << 20, free // 4)
    biggest = max(1 << 12, min(4 << 20, cap // 64))
    rng = random.Random(seed)
    plan, live, used = [], [], 0
    for i in range(ops):
        n = int(2 ** rng.uniform(8, biggest.bit_length() - 1))
        if live and (rng.random() < 0.45 or used + n > cap):
            k = live.pop(rng.randrange(len(live)))
            used -= plan[k][1]
            plan.append(("f", k, 0))
        else:
            live.append(len(plan))
            used += n
            plan.append(("a", n, i % 4))
    return plan


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
        plan = demo_workload(drv, args.ops)
        ptrs: dict[int, int] = {}
        quiet = getattr(args, "quiet", False) or not (out is sys.stdout and sys.stdout.isatty()) \
            and not getattr(args, "progress", False)
        bar, advance = _progress(len(plan), "allocate/free", quiet)
        t0 = time.perf_counter()
        with bar:
            for i, (kind, a, b) in enumerate(plan):
                if kind == "a":
                    s = streams[b]
                    p = ptrs[i] = mr.allocate(a, s)
                    drv.touch(p, a, s.handle)  # a kernel writing the block, checked on the simulator
                else:
                    _, n, sidx = plan[a]
                    mr.deallocate(ptrs.pop(a), n, streams[sidx])
                if i % 256 == 255:
                    advance(256)
            advance(len(plan) % 256)
        for i, p in ptrs.items():
            mr.deallocate(p, plan[i][1], streams[plan[i][2]])
        for s in streams:
            s.synchronize()
        dt = time.perf_counter() - t0
        st = mr.statistics
        held = pool.pool_size
        released = pool.release()
        rows = [("backend", f"{drv.name} ({drv.device_name(0)})"),
                ("allocate/free calls", f"{len(plan)} on {len(streams)} streams"),
                ("time", f"{dt * 1e3:.1f} ms" + (f" ({dt * 1e6 / len(plan):.1f} us per call, kernels included)"
                                                 if plan else "")),
                ("allocations", f"{st.total_count} ({format_size(st.total_bytes)} in all)"),
                ("peak live", f"{format_size(st.peak_bytes)} in at most {st.peak_count} blocks"),
                ("pool held at the end", format_size(held)),
                ("release() gave back", format_size(released)),
                ("bytes lost", format_size(held - released) if held != released else "0 B")]
        _table("mrkit demo: statistics(pool(device))", rows, out)
        for s in streams:
            s.close()
        if held != released or st.current_bytes:
            print("  memory was lost (this is a bug in mrkit)", file=out)
            return 1
        if isinstance(drv, SimDriver):
            print("stream-order checker: a naive pool that hands a block freed on stream A to stream B", file=out)
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


def cmd_snapshot(args, out=None) -> int:
    """Turn an allocation log into a memory_viz snapshot (its history as the trace)."""
    import pickle

    from ._snapshot import snapshot_from_log

    out = out or sys.stdout
    snap = snapshot_from_log(args.log)
    with open(args.output, "wb") as f:
        pickle.dump(snap, f)
    n = len(snap["device_traces"][0])
    print(f"{args.output}: {n} trace events from {args.log}; open it at https://pytorch.org/memory_viz", file=out)
    return 0


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="mrkit", description="Stream-ordered memory resources for CUDA.")
    parser.add_argument("--version", action="version", version=f"mrkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, devices and the capabilities mrkit uses")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    demo = sub.add_parser("demo", help="run a multi-stream workload through a pool (GPU, else simulator)")
    demo.add_argument("--backend", choices=["cuda", "sim"], default=None,
                      help="force a backend (default: the GPU if there is one, else the simulator)")
    demo.add_argument("--ops", type=_positive_int, default=20000, help="allocate/free calls to make")
    demo.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    rep = sub.add_parser("replay", help="replay an allocation log (mrkit's or RMM's CSV) against resources")
    rep.add_argument("log", help="the CSV log (Thread,Time,Action,Pointer,Size,Stream)")
    rep.add_argument("--resource", action="append", default=None,
                     help="a resource spec, e.g. 'pool(device)'; repeat to compare (default: device, pool(device))")
    rep.add_argument("--backend", choices=["cuda", "sim"], default=None,
                     help="force a backend (default: the GPU if there is one, else the simulator)")
    snap = sub.add_parser("snapshot", help="turn an allocation log into a PyTorch memory_viz snapshot")
    snap.add_argument("log", help="the CSV log (mrkit's or RMM's)")
    snap.add_argument("-o", "--output", required=True, help="the pickle to write (e.g. snap.pickle)")
    return parser


def main(argv=None) -> int:
    """The ``mrkit`` command. Usage errors exit 2 and failures exit 1, each with one line
    ``mrkit: error: ...`` on stderr (``--debug`` shows the traceback instead)."""
    parser = _parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints "mrkit: error: ..." and exits 2
    if args.command == "replay" and not args.resource:
        args.resource = ["device", "pool(device)"]
    try:
        return {"info": cmd_info, "demo": cmd_demo, "replay": cmd_replay,
                "snapshot": cmd_snapshot}[args.command](args)
    except BrokenPipeError:  # `mrkit info | head`: the reader left; that is not an error
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("mrkit: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line reports, it does not crash
        if args.debug:
            raise
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"mrkit: error: {msg} ({type(exc).__name__}; run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
