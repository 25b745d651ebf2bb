"""The ``mrkit`` command: ``mrkit info``, ``demo``, ``replay`` and ``snapshot``."""
from __future__ import annotations

import argparse
import platform
import sys
import textwrap
import time
from importlib import metadata

from ._errors import CUDAUnavailableError, StreamOrderViolation
from ._sizes import format_size
from ._ui import grid as _grid, progress as _progress, table as _table

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
    """(backend the process uses, why) without touching the GPU more than asking for its count: the
    same choice the library makes (:func:`mrkit.driver.auto_backend`)."""
    from .driver import CudaDriver, auto_backend, env_backend

    env = env_backend()
    if env == "sim":
        return "sim", "MRKIT_BACKEND=sim is set"
    if env is None:
        drv, why = auto_backend()
        if why is not None:
            return "none", f"MRKIT_BACKEND is unset and {why}"
        n = drv.device_count()
        return "cuda", f"a CUDA driver with {n} device{'s' if n != 1 else ''} is present (MRKIT_BACKEND unset)"
    try:
        n = CudaDriver().device_count()
    except CUDAUnavailableError as exc:
        return "none", f"MRKIT_BACKEND=cuda but {exc.explanation}"
    if n == 0:
        return "none", "MRKIT_BACKEND=cuda but the CUDA driver reports no device"
    return "cuda", "MRKIT_BACKEND=cuda is set"


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
    from ._engine import core_description, core_name
    from .driver import CudaDriver, SimDriver

    backend, why = _backend_story()
    if getattr(args, "json", False):
        import json
        drv = CudaDriver() if backend == "cuda" else SimDriver()
        data = {"mrkit": __version__, "python": platform.python_version(),
                "packages": {p: _version(p) for p in ("cuda-bindings", "numpy", "cupy-cuda13x", "cupy-cuda12x",
                                                      "torch", "rich")},
                "core": core_name(), "core_detail": core_description(),
                "backend": "sim" if backend == "none" else backend, "reason": why,
                "driver_version": drv.driver_version(), "devices": _devices_json(drv)}
        print(json.dumps(data, indent=2), file=out)
        return 0
    print(f"mrkit {__version__} on Python {platform.python_version()} "
          f"(cuda-bindings {_version('cuda-bindings')}, numpy {_version('numpy')}, cupy "
          f"{_version('cupy-cuda13x') if _version('cupy-cuda13x') != 'not installed' else _version('cupy-cuda12x')})",
          file=out)
    print(f"core: {core_description()}", file=out)
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
    """The driver a command runs on: ``--backend``, else what the library would choose
    (:func:`mrkit.driver.auto_backend`); the simulator the commands use schedules at random."""
    from .driver import CudaDriver, SimDriver, auto_backend

    if backend is None:
        drv, _ = auto_backend()
        return SimDriver(policy="random", seed=7) if isinstance(drv, SimDriver) else drv
    if backend == "sim":
        return SimDriver(policy="random", seed=7)
    drv = CudaDriver()
    if drv.device_count() == 0:  # CUDAUnavailableError without a driver
        raise CUDAUnavailableError("CUDA_NO_DEVICE", None, "cuDeviceGetCount", "the CUDA driver reports no device")
    return drv


def _wants_progress(args, out) -> bool:
    return not (getattr(args, "quiet", False) or not (out is sys.stdout and sys.stdout.isatty())
                and not getattr(args, "progress", False))


def demo_workload(drv, ops: int, seed: int = 0):
    """The demo's workload, sized to the device: sizes log-uniform from 256 B up to 4 MiB (less on a
    small device), live bytes capped at a quarter of the device's free memory; returns the plan as
    a list of ("a", size, stream index) / ("f", index of the allocation) steps."""
    free, _ = drv.mem_get_info(0)
    cap = max(1 << 20, free // 4)
    biggest = max(1 << 12, min(4 << 20, cap // 64))
    from ._bench import random_plan
    return random_plan(ops, biggest.bit_length() - 1, cap, streams=4, p_free=0.45, seed=seed)


def _demo_plot_path(args):
    """``--plot PATH``; by default ``mrkit-demo.png`` where matplotlib is installed; ``--no-plot``: none."""
    if getattr(args, "no_plot", False):
        return None
    if getattr(args, "plot", None):
        return args.plot
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    return "mrkit-demo.png"


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
        bar, advance = _progress(len(plan), "allocate/free", not _wants_progress(args, out))
        from ._plot import Timeline
        tl = Timeline()
        clock = time.perf_counter
        t0 = clock()
        with bar:
            for i, (kind, a, b) in enumerate(plan):
                if kind == "a":
                    s = streams[b]
                    p = ptrs[i] = mr.allocate(a, s)
                    drv.touch(p, a, s.handle)  # a kernel writing the block, checked on the simulator
                    tl.step(clock() - t0, s.handle, a)
                else:
                    _, n, sidx = plan[a]
                    mr.deallocate(ptrs.pop(a), n, streams[sidx])
                    tl.step(clock() - t0, streams[sidx].handle, -n)
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
        plot_path = _demo_plot_path(args)
        if plot_path:
            from ._plot import plot_timeline
            plot_timeline(tl, plot_path, f"mrkit demo: {len(plan)} calls on 4 streams ({drv.name})")
            print(f"memory over time: {plot_path}", file=out)
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
                print(textwrap.fill(str(exc).splitlines()[0], width=100, initial_indent="    ",
                                    subsequent_indent="      "), file=out)
            drv.stream_synchronize(a.handle)
            drv.mem_free(p)
    return 0


def cmd_replay(args, out=None) -> int:
    """Replay an allocation log (ours or RMM's) against resource specs and compare them."""
    out = out or sys.stdout
    from ._spec import resource_from_spec
    from .adaptors import StatisticsAdaptor, read_log, replay
    from .driver import use_backend

    drv = _demo_driver(args.backend)
    events = read_log(args.log)
    if not getattr(args, "json", False):
        print(f"{len(events)} events from {args.log} on the {drv.name} backend", file=out)
    rows, results = [], []
    bar, advance = _progress(len(events) * len(args.resource), "replay", not _wants_progress(args, out))
    with use_backend(drv), bar:
        for spec in args.resource:
            mr = resource_from_spec(spec, drv)
            r = replay(events, mr, driver=drv, progress=advance)
            peak = mr.statistics.peak_bytes if isinstance(mr, StatisticsAdaptor) else None
            results.append({"resource": spec, "events": r.events, "us_per_event": r.us_per_event,
                            "peak_live_bytes": r.peak_live_bytes, "held_bytes": r.held_bytes,
                            "failures": r.failures, "statistics_peak_bytes": peak})
            rows.append([spec, f"{r.us_per_event:.2f}", format_size(r.peak_live_bytes),
                         "-" if r.held_bytes is None else format_size(r.held_bytes), str(r.failures)])
    if getattr(args, "json", False):
        import json
        print(json.dumps({"log": str(args.log), "backend": drv.name, "results": results}, indent=2), file=out)
    else:
        _grid("replay summary", ["resource", "us/event", "peak live", "held at the end", "out of memory"], rows, out)
    return 0


def cmd_bench(args, out=None) -> int:
    """Measure a resource spec beside CuPy's and PyTorch's allocators on the chosen workloads."""
    import json

    from ._bench import WORKLOADS, run_bench
    from .driver import use_backend

    out = out or sys.stdout
    drv = _demo_driver(args.backend)
    workloads = args.workload or list(WORKLOADS)
    from ._bench import _others
    n_alloc = 1 + len(_others(drv))
    bar, advance = _progress(len(workloads) * args.rounds * n_alloc, "bench", not _wants_progress(args, out))
    with use_backend(drv), bar:
        res = run_bench(args.resource, workloads, drv, ops=args.ops, rounds=args.rounds, advance=advance)
    if args.json:
        print(json.dumps(res, indent=2), file=out)
        return 0
    names = res["allocators"]
    others = [n for n in names if not n.startswith("mrkit ")]
    rows = [[w] + [f"{res['workloads'][w][n]:.2f}" for n in names] +
            [f"{res['ratios'][w][o]:.2f}x" for o in others] for w in workloads]
    _grid(f"mrkit bench on {res['backend']} ({res['device']}): us per call, median of {args.rounds}",
          ["workload"] + names + [f"mrkit / {o}" for o in others], rows, out)
    if not others:
        print("(no CuPy or PyTorch on a GPU here: mrkit measured alone)", file=out)
    return 0


def cmd_plot(args, out=None) -> int:
    """Draw memory in use over time, per stream, from an allocation log."""
    from ._plot import plot_log

    out = out or sys.stdout
    tl = plot_log(args.log, args.output)
    print(f"{args.output}: {len(tl.times)} events, {len(tl.per_stream)} streams, peak {format_size(tl.peak)} "
          f"at {tl.peak_time:.3f} s", file=out)
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


PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".html")


def _output_path(suffixes):
    """An argparse type: a path to write, whose folder exists and whose extension is one of ``suffixes``
    (checked before any work starts)."""
    def check(text: str) -> str:
        import os
        folder = os.path.dirname(os.path.abspath(text))
        ext = os.path.splitext(text)[1].lower()
        if suffixes and ext not in suffixes:
            raise argparse.ArgumentTypeError(f"unsupported extension {ext or '(none)'!r} in {text!r} "
                                             f"(expected {', '.join(suffixes)})")
        if not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(f"the folder {folder} does not exist")
        return text
    return check


def _spec_arg(text: str) -> str:
    from ._spec import parse_spec
    try:
        parse_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(" ".join(str(exc).split("\n")[0].split())) from None
    return text


def _existing_file(text: str) -> str:
    import os
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def _common_parsers() -> dict[str, argparse.ArgumentParser]:
    """Flags shared by several commands, each declared once (every one is valid after its command)."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
    backend = argparse.ArgumentParser(add_help=False)
    backend.add_argument("--backend", choices=["cuda", "sim"], default=None,
                         help="force a backend (default: MRKIT_BACKEND, else the GPU if there is one, else the simulator)")
    js = argparse.ArgumentParser(add_help=False)
    js.add_argument("--json", action="store_true", help="machine-readable output: pure JSON on stdout")
    progress = argparse.ArgumentParser(add_help=False)
    group = progress.add_mutually_exclusive_group()
    group.add_argument("--progress", action="store_true",
                       help="show the progress bar even when not on a terminal (plain text without rich)")
    group.add_argument("--quiet", action="store_true", help="no progress bar")
    return {"debug": debug, "backend": backend, "json": js, "progress": progress}


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    c = _common_parsers()
    parser = argparse.ArgumentParser(prog="mrkit", description="Stream-ordered memory resources for CUDA.",
                                     parents=[c["debug"]])
    parser.add_argument("--version", action="version", version=f"mrkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name, help, *shared):
        return sub.add_parser(name, help=help, parents=[c["debug"]] + [c[k] for k in shared])

    command("info", "versions, devices and the capabilities mrkit uses", "json")
    demo = command("demo", "run a multi-stream workload through a pool (GPU, else simulator)", "backend", "progress")
    demo.add_argument("--ops", type=_positive_int, default=20000, help="allocate/free calls to make")
    plot = demo.add_mutually_exclusive_group()
    plot.add_argument("--plot", metavar="PATH", type=_output_path(PLOT_SUFFIXES),
                      help="draw memory over time to PATH (.png/.svg/.pdf/.html; "
                      "default mrkit-demo.png where matplotlib is installed)")
    plot.add_argument("--no-plot", action="store_true", help="draw no picture")
    rep = command("replay", "replay an allocation log (mrkit's or RMM's CSV) against resources",
                  "backend", "json", "progress")
    rep.add_argument("log", help="the CSV log (Thread,Time,Action,Pointer,Size,Stream)")
    rep.add_argument("--resource", action="append", default=None, type=_spec_arg,
                     help="a resource spec, e.g. 'pool(device)'; repeat to compare (default: device, pool(device))")
    bench = command("bench", "measure a resource spec beside CuPy's and PyTorch's allocators",
                    "backend", "json", "progress")
    bench.add_argument("--resource", default="pool(device)", type=_spec_arg,
                       help="the resource spec to measure (default: pool(device))")
    bench.add_argument("--workload", action="append", choices=["pairs", "batch", "random", "streams"],
                       help="repeat to pick several (default: all)")
    bench.add_argument("--ops", type=_positive_int, default=20000, help="calls per workload and round")
    bench.add_argument("--rounds", type=_positive_int, default=3, help="rounds per allocator (median reported)")
    plot = command("plot", "draw memory in use over time from an allocation log (needs mrkit[plot])")
    plot.add_argument("log", type=_existing_file, help="the CSV log (mrkit's or RMM's)")
    plot.add_argument("-o", "--output", required=True, type=_output_path(PLOT_SUFFIXES),
                      help="out.png, .svg, .pdf or .html")
    snap = command("snapshot", "turn an allocation log into a PyTorch memory_viz snapshot")
    snap.add_argument("log", type=_existing_file, help="the CSV log (mrkit's or RMM's)")
    snap.add_argument("-o", "--output", required=True, type=_output_path(()),
                      help="the pickle to write (e.g. snap.pickle)")
    return parser


def _check_environment(args) -> None:
    """MRKIT_BACKEND and MRKIT_RESOURCE, checked before any work (each error names its variable)."""
    import os

    from ._current import env_spec
    from .driver import env_backend
    env_backend()
    if os.environ.get("MRKIT_RESOURCE"):
        env_spec()
        if args.command in ("demo", "replay", "bench"):
            env_spec(_demo_driver(getattr(args, "backend", None)).device_count())


def main(argv=None) -> int:
    """The ``mrkit`` command. Usage errors (bad flags, paths, specs and environment variables, all
    checked before any work) exit 2 and failures exit 1, each with one line ``mrkit: error: ...`` on
    stderr (``--debug``, before or after the command, shows the traceback instead)."""
    import warnings

    from ._errors import SimulatorFallbackWarning

    parser = _parser()
    args = parser.parse_args(argv)  # usage errors: argparse prints "mrkit: error: ..." and exits 2
    debug = getattr(args, "debug", False)
    if args.command == "replay" and not args.resource:
        args.resource = ["device", "pool(device)"]
    with warnings.catch_warnings():
        # the command line says which backend it runs on in its own words
        warnings.simplefilter("ignore", SimulatorFallbackWarning)
        try:
            _check_environment(args)
        except ValueError as exc:
            if debug:
                raise
            print(f"mrkit: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        try:
            return {"info": cmd_info, "demo": cmd_demo, "replay": cmd_replay, "bench": cmd_bench,
                    "plot": cmd_plot, "snapshot": cmd_snapshot}[args.command](args)
        except BrokenPipeError:  # `mrkit info | head`: the reader left; that is not an error
            import os
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except KeyboardInterrupt:
            print("mrkit: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:  # noqa: BLE001 - the command line reports, it does not crash
            if debug:
                raise
            msg = " ".join(str(exc).split()) or type(exc).__name__
            print(f"mrkit: error: {msg} ({type(exc).__name__}; run with --debug for the traceback)",
                  file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
