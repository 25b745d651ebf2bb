"""Where did the memory go? Per-scope counters and a per-function profile of the current resource
(runs on the GPU if there is one, else on the simulated device)."""
import mrkit
import mrkit.statistics as ms

has_gpu = mrkit.get_driver().name == "cuda"  # else mrkit runs on the simulated device

mrkit.set_current_resource(mrkit.PoolResource(mrkit.CudaMemoryResource()))
mr = ms.enable_statistics()


@ms.profiler(name="forward")
def forward(batch):
    acts = [mr.allocate(batch << 10, mrkit.DEFAULT_STREAM) for _ in range(4)]
    for p in acts:
        mr.deallocate(p, batch << 10, mrkit.DEFAULT_STREAM)


with ms.statistics() as epoch:
    for batch in (64, 128, 256):
        forward(batch)
    with ms.profiler("checkpoint"):
        p = mr.allocate(8 << 20, mrkit.DEFAULT_STREAM)
        mr.deallocate(p, 8 << 20, mrkit.DEFAULT_STREAM)

print(ms.report())
print(epoch)
rec = ms.profiler_records()["forward"]
assert (rec.calls, rec.allocations, rec.peak_bytes) == (3, 12, 4 * (256 << 10))
assert epoch.peak_bytes == 8 << 20 and epoch.current_bytes == 0 and epoch.total_count == 13
