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
