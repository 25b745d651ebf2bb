"""CuPy's allocator hooks without CuPy: ``mrkit.cupy.AllocatorHooks`` follows each device's current
resource, and a block goes home to the resource that served it, whatever is current when it dies.

This is the half of ``mrkit.cupy.allocator()`` that CuPy does not need: what CuPy calls for every
``cupy.empty`` (``malloc(nbytes, device)``, and the free hook its memory object keeps). Runs as
written on a machine without a GPU (mrkit falls back to its simulated device, saying so once).
"""
import mrkit
from mrkit.cupy import AllocatorHooks

first = mrkit.StatisticsAdaptor(mrkit.PoolResource(mrkit.CudaMemoryResource()))
second = mrkit.StatisticsAdaptor(mrkit.CudaMemoryResource())
stream = mrkit.Stream.create()
hooks = AllocatorHooks(None, lambda device: stream)  # CuPy passes its current stream's getter

with mrkit.using(first):
    ptr, free = hooks.malloc(1 << 20, 0)              # served by `first`, on `stream`
    assert hooks.resource_for(0) is first

with mrkit.using(second):                             # the current resource is replaced ...
    other, other_free = hooks.malloc(4096, 0)         # ... so the next block comes from `second`
    assert hooks.resource_for(0) is second
    free(ptr, 0)                                      # ... and the first block still goes home
    other_free(other, 0)

assert first.statistics.total_count == 1 and first.statistics.current_bytes == 0
assert second.statistics.total_count == 1 and second.statistics.current_bytes == 0
stream.close()
print("two blocks from two resources, each back where it came from")
