"""Coming from RMM or CuPy: their habits work in mrkit, and its first hour has no surprises.

Runs as written on a machine without a GPU (mrkit falls back to its simulated device, saying so once).
"""
import tempfile
from pathlib import Path

import mrkit
import mrkit.statistics as ms

drv = mrkit.get_driver()  # the GPU if there is one, else the simulated device
log = Path(tempfile.mkdtemp()) / "mem.csv"

# rmm.reinitialize(pool_allocator=True, initial_pool_size=..., logging=True, log_file_name=...)
built = mrkit.reinitialize(pool_allocator=True, initial_pool_size="64 MiB", logging=True,
                           log_file_name=str(log), devices=[0])
mr = mrkit.get_current_device_resource()          # rmm.mr.get_current_device_resource()
assert mr is built[0] and isinstance(mr.upstream, mrkit.PoolResource)

# rmm.statistics: push/pop counter frames; profiler records by name
with ms.statistics() as s:                        # installs a StatisticsAdaptor for the scope only
    counting = mrkit.get_current_resource()
    p = counting.allocate(1 << 20, mrkit.DEFAULT_STREAM)
    with ms.profiler(name="step"):
        q = counting.allocate(4096, mrkit.DEFAULT_STREAM)
        counting.deallocate(q, 4096, mrkit.DEFAULT_STREAM)
    counting.deallocate(p, 1 << 20, mrkit.DEFAULT_STREAM)
assert mrkit.get_current_resource() is mr           # ... and puts the resource back afterwards
assert (s.total_bytes, s.peak_bytes) == ((1 << 20) + 4096, (1 << 20) + 4096)
assert ms.default_profiler_records.records["step"].total_bytes == 4096

# CuPy's MemoryPool names on a pool: used_bytes(), total_bytes(), free_all_blocks()
pool = mr.upstream
assert pool.used_bytes() == 0 and pool.total_bytes() >= 64 << 20
pool.free_all_blocks()
assert pool.total_bytes() == 0

# BinningMemoryResource's exponents; RMM's pool keywords
bins = mrkit.BinningResource(mrkit.DeviceMemoryResource(), min_size_exponent=10, max_size_exponent=20)
assert (bins.bin_size(100), bins.max_bin) == (1024, 1 << 20)

# names mrkit spells differently say what to use
try:
    mrkit.get_per_device_resource
except AttributeError as exc:
    hint = str(exc)
assert "get_current_resource(device)" in hint

mrkit.reinitialize()                                # back to the defaults; closes the log
events = mrkit.read_log(log)
assert [e.size for e in events if e.action == "allocate"] == [1 << 20, 4096]
print(f"RMM habits on the {drv.name} backend: reinitialize, statistics, profiler, CuPy names, hints - all ok")
print(f"the log has {len(events)} events; hint for a missing name: {hint}")
