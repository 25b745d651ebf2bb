"""Per-device resources in one call, and one CuPy allocator for every device.

`mrkit.reinitialize` sets up each device's current resource (a pool here, sized as a fraction of the
device, with statistics and one log file per device); `cupy=True` makes mrkit CuPy's allocator, and
CuPy's current device picks the resource. Runs on the GPU(s) with CuPy when present, else on a
simulated machine with 2 devices (device selection shown with the resources directly)."""
import tempfile
from pathlib import Path

import mrkit
from mrkit.driver import CudaDriver, SimDriver, set_backend

try:
    ngpu = CudaDriver().device_count()
except mrkit.CUDAUnavailableError:
    ngpu = 0
try:
    import cupy
except ImportError:
    cupy = None
on_gpu = ngpu > 0 and cupy is not None
if not on_gpu:
    set_backend(SimDriver(2))
devices = list(range(min(ngpu, 2))) if on_gpu else [0, 1]

logdir = Path(tempfile.mkdtemp())
got = mrkit.reinitialize("pool", devices=devices, initial_pool_size=0.01, log_file=logdir / "mem.csv",
                         statistics=True, cupy=on_gpu)
for d, mr in got.items():
    if on_gpu:
        with cupy.cuda.Device(d):
            x = cupy.arange(1_000_000, dtype=cupy.int64)
            assert int(x.sum()) == 499999500000
            assert x.data.mem.size % 512 == 0  # CuPy's pool contract: rounded to 512 bytes
            held = mr.statistics.current_bytes
            del x  # its block goes back to this device's pool (CuPy may keep small workspaces)
            assert mr.statistics.current_bytes <= held - 4_000_000
    else:
        p = mr.allocate(4_000_000, mrkit.DEFAULT_STREAM)  # DEFAULT_STREAM: this device's own
        mr.deallocate(p, 4_000_000, mrkit.DEFAULT_STREAM)
    s = mr.statistics
    assert mrkit.get_current_resource(d) is mr and s.total_count >= 1
    print(f"device {d}: {mr!r}: {s.total_count} allocation(s), peak {mrkit.format_size(s.peak_bytes)}")

if on_gpu:
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)  # CuPy's own pool again
mrkit.reinitialize()  # back to the defaults; closes the logs
logs = sorted(logdir.glob("*.csv"))
assert [p.name for p in logs] == ["mem.csv", "mem.device1.csv"][:len(devices)]
for p in logs:
    events = mrkit.read_log(p)
    freed = {e.pointer for e in events if e.action == "free"}
    big = [e for e in events if e.action == "allocate" and e.size >= 4_000_000]
    assert big and all(e.pointer in freed for e in big)
    print(f"{p.name}: {len(events)} events, the big block freed")
