"""Resource specs, DLPack export, and (when CuPy and a GPU are present) CuPy's allocator hook."""
import numpy as np

import mrkit

gpu = mrkit.get_driver().name == "cuda"  # the GPU if there is one, else the simulated device

# A composition named by a spec (MRKIT_RESOURCE=<spec> does the same for code you cannot edit).
mr = mrkit.resource_from_spec("statistics(limiting(pool(device), 1GiB))")
print("built:", mr)

# Zero-copy export: host memory to NumPy through DLPack (device memory goes to PyTorch, JAX, CuPy).
host = mrkit.HostMemoryResource()
buf = host.allocate_buffer(8)
host.view(buf.ptr, 8)[:] = bytes(range(8))
arr = np.from_dlpack(buf)
print("numpy view of mrkit memory:", arr, "same pointer:", arr.ctypes.data == buf.ptr)

if gpu:
    try:
        import cupy

        import mrkit.cupy
    except ImportError:
        print("CuPy is not installed: skipping the allocator hook")
    else:
        with mrkit.cupy.using_allocator(mr):
            x = cupy.arange(1_000_000, dtype=cupy.float32)
            print("cupy sum through mrkit:", float(x.sum()), mr.statistics)
else:
    print("no GPU: the CuPy allocator hook needs one (see docs/guide.md)")
