"""VirtualMemoryResource: grow without copying, give physical memory back (GPU, else the simulator)."""
import mrkit
from mrkit.driver import CudaDriver, SimDeviceSpec, SimDriver

try:
    drv = CudaDriver() if CudaDriver().device_count() else None
except mrkit.CUDAUnavailableError:
    drv = None
drv = drv or SimDriver([SimDeviceSpec(total_memory=4 << 30)])
MiB = 1 << 20

mr = mrkit.VirtualMemoryResource(0, mrkit.VirtualMemoryResourceOptions(reserve_size="8 GiB"), driver=drv)
with mrkit.Stream.create(driver=drv) as s:
    a = mr.allocate(100 * MiB, s)
    b = mr.allocate(300 * MiB, s)  # placed right after a: the range grows in place
    print(f"mapped {mr.mapped_bytes // MiB} MiB for 400 MiB live; b follows a: {b == a + 100 * MiB}")
    mr.deallocate(b, 300 * MiB, s)
    print(f"trim gave back {mr.trim() // MiB} MiB; {mr.mapped_bytes // MiB} MiB still mapped for a")
    c = mr.allocate(50 * MiB, s)  # maps pages again on demand
    print(f"after a new 50 MiB block: {mr.mapped_bytes // MiB} MiB mapped (peak {mr.mapped_high // MiB} MiB)")
    mr.deallocate(c, 50 * MiB, s)
    mr.deallocate(a, 100 * MiB, s)
mr.close()

# footprint_limit: when new pages would take the physical memory past 1.0x the live peak, mrkit moves
# the physical memory of free holes (unmap, then map where needed) instead of creating more
mr = mrkit.VirtualMemoryResource(0, mrkit.VirtualMemoryResourceOptions(reserve_size="8 GiB", footprint_limit=1.0,
                                                                        max_mapping="16 MiB"), driver=drv)
with mrkit.Stream.create(driver=drv) as s:
    a = mr.allocate(128 * MiB, s)
    b = mr.allocate(64 * MiB, s)
    mr.deallocate(a, 128 * MiB, s)  # a 128 MiB hole below b, still mapped
    c = mr.allocate(192 * MiB, s)  # does not fit the hole: placed above b
    print(f"256 MiB live at most, {mr.physical_bytes // MiB} MiB physical; {mr.moves} allocations moved "
          f"out of the hole")
    mr.deallocate(b, 64 * MiB, s)
    mr.deallocate(c, 192 * MiB, s)
mr.close()

# a loop that allocates and frees a few sizes in turn (nothing live between calls) settles on the
# lock-free cache: after three rounds (a size is cached once it keeps coming back) no call takes the
# locked path, and nothing new is mapped
mr = mrkit.VirtualMemoryResource(0, mrkit.VirtualMemoryResourceOptions(reserve_size="8 GiB"), driver=drv)
s = mrkit.DEFAULT_STREAM
sizes = (256, 64 << 10, 3 * MiB)
for i in range(9):
    mr.deallocate(mr.allocate(sizes[i % 3], s), sizes[i % 3], s)
misses, mapped = mr.arena.misses, mr.mapped_bytes
for i in range(300):
    mr.deallocate(mr.allocate(sizes[i % 3], s), sizes[i % 3], s)
print(f"300 calls over three sizes: {mr.arena.misses - misses} took the locked path, "
      f"{(mr.mapped_bytes - mapped) // MiB} MiB newly mapped")
assert mr.arena.misses == misses and mr.mapped_bytes == mapped
mr.close()
