"""A driver memory pool of your own: options, attributes, trimming (GPU, else the simulator)."""
import mrkit

drv = mrkit.get_driver()  # the GPU if there is one, else the simulated device (with one warning)

opts = mrkit.DeviceMemoryResourceOptions(initial_size="16 MiB", release_threshold="64 MiB")
mr = mrkit.DeviceMemoryResource(0, opts)
with mrkit.Stream.create() as s:
    p = mr.allocate(8 << 20, s)
    mr.deallocate(p, 8 << 20, s)
    s.synchronize()
print({k: v for k, v in mr.pool.attributes.items() if "mem" in k})
mr.trim()
print("after trim, reserved:", mr.pool.reserved_mem_current)
mr.close()
