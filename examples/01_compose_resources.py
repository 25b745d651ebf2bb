"""Compose a resource stack and allocate on streams.

Runs on a GPU if there is one, else on mrkit's simulated device:  python examples/01_compose_resources.py
"""
import mrkit

drv = mrkit.get_driver()  # the GPU if there is one, else the simulated device (with one warning)

# where memory comes from -> a fast sub-allocating pool -> a cap -> counters
mr = mrkit.StatisticsAdaptor(mrkit.LimitingAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource()), "1 GiB"))

with mrkit.Stream.create() as s:
    ptrs = [mr.allocate(n, s) for n in (256, 4096, 1 << 20)]
    drv.memset_async(ptrs[2], 0xAB, 1 << 20, s.handle)
    for p, n in zip(ptrs, (256, 4096, 1 << 20)):
        mr.deallocate(p, n, s)  # stream-ordered: work already queued on s may still use it
    s.synchronize()

with mrkit.Stream.create() as s, mr.allocate_buffer(1000, s) as buf:  # an owning Buffer
    print("buffer:", buf, buf.__cuda_array_interface__["shape"])

print("statistics:", mr.statistics)
assert mr.statistics.current_bytes == 0 and mr.statistics.total_count == 4
