import ctypes, faulthandler, sys, time
faulthandler.dump_traceback_later(20, exit=True)
from mrkit.driver import CudaDriver
d = CudaDriver(); d.ensure_context(0)
t = time.time()
p = d.mem_host_alloc(4096); print("hostalloc", time.time() - t, flush=True)
d.memset_async(p, 3, 4096, 0); print("memset", flush=True)
d.stream_synchronize(0); print("sync", flush=True)
print(ctypes.string_at(p, 4), flush=True)
d.mem_free_host(p); print("freed", flush=True)
