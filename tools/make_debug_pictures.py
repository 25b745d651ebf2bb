"""Regenerate the pictures and outputs in docs/debugging.md from the simulator (deterministic):

    python tools/make_debug_pictures.py [--out docs/img]

Writes timeline.png (a log drawn by `mrkit plot`), fragmentation.png (a run that ends out of memory
with plenty free), profiler.txt (`mrkit.statistics.report()`), snapshot.txt (a snapshot's segments),
and prints what it wrote."""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mrkit  # noqa: E402
import mrkit.statistics as mst  # noqa: E402
from mrkit import (DEFAULT_STREAM, DeviceMemoryResource, LoggingAdaptor, OutOfMemoryError, PoolResource,  # noqa: E402
                   Stream, TrackingAdaptor)
from mrkit._cli import main as cli  # noqa: E402
from mrkit.driver import SimDriver, SimDeviceSpec, use_backend  # noqa: E402


def timeline(out: Path) -> None:
    """Three streams with phases of different sizes, logged and drawn."""
    log = out / "timeline.csv"
    with use_backend(SimDriver(seed=1)):
        mr = LoggingAdaptor(PoolResource(DeviceMemoryResource()), log)
        streams = [DEFAULT_STREAM, Stream.create(), Stream.create()]
        live = []
        for step in range(600):
            s = streams[step % 3]
            size = (1 << 20) * (1 + (step // 150) * (step % 3 + 1))
            live.append((mr.allocate(size, s), size, s))
            if len(live) > 40 or (step > 450 and live):
                p, n, st = live.pop(0)
                mr.deallocate(p, n, st)
        for p, n, st in live:
            mr.deallocate(p, n, st)
        mr.close()
    with contextlib.redirect_stdout(io.StringIO()):
        cli(["plot", str(log), "-o", str(out / "timeline.png")])
    log.unlink()


def fragmentation(out: Path) -> None:
    """A 256 MiB device: small blocks pinned between big ones, then a big request fails although
    more than it is free in all: the picture shows the out-of-memory mark against the total."""
    log = out / "fragmentation.csv"
    with use_backend(SimDriver([SimDeviceSpec(total_memory=256 << 20)])):
        mr = LoggingAdaptor(PoolResource(DeviceMemoryResource()), log)
        big, small = [], []
        try:
            for _ in range(200):
                big.append(mr.allocate(6 << 20, DEFAULT_STREAM))
                small.append(mr.allocate(64 << 10, DEFAULT_STREAM))
        except OutOfMemoryError:
            pass
        for p in big[::2]:
            mr.deallocate(p, 6 << 20, DEFAULT_STREAM)
        with contextlib.suppress(OutOfMemoryError):
            mr.allocate(64 << 20, DEFAULT_STREAM)  # ~100 MiB free, but in 6 MiB holes
        mr.close()
    with contextlib.redirect_stdout(io.StringIO()):
        cli(["plot", str(log), "-o", str(out / "fragmentation.png")])
    log.unlink()


def profiler_and_snapshot(out: Path) -> None:
    with use_backend(SimDriver()):
        mrkit.set_current_resource(TrackingAdaptor(PoolResource(DeviceMemoryResource())))
        mst.enable_statistics()
        mr = mrkit.get_current_resource()
        keep = []

        @mst.profiler(name="load_batch")
        def load_batch():
            keep.append(mr.allocate(8 << 20, DEFAULT_STREAM))

        @mst.profiler(name="forward")
        def forward():
            tmp = [mr.allocate(2 << 20, DEFAULT_STREAM) for _ in range(6)]
            for p in tmp:
                mr.deallocate(p, 2 << 20, DEFAULT_STREAM)

        for _ in range(3):
            load_batch()
            forward()
        (out / "profiler.txt").write_text(mst.report() + "\n")
        snap = mrkit.snapshot(mr)
        lines = [f"{len(snap['segments'])} segments"]
        for seg in snap["segments"]:
            states = [b["state"] for b in seg["blocks"]]
            lines.append(f"segment {seg['address']:#x} {seg['total_size'] >> 20} MiB: "
                         f"{states.count('active_allocated')} allocated, {states.count('inactive')} free blocks")
        (out / "snapshot.txt").write_text("\n".join(lines) + "\n")
        for p in keep:
            mr.deallocate(p, 8 << 20, DEFAULT_STREAM)
        mst.reset_profiler()
        mrkit._current._reset_current_resources()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "img"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    timeline(out)
    fragmentation(out)
    profiler_and_snapshot(out)
    for f in sorted(out.iterdir()):
        print(f"{f} ({f.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
