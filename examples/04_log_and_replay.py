"""Log allocations in RMM's CSV format, then replay the log against another resource."""
import io

import mrkit
from mrkit.driver import SimDriver

drv = SimDriver()
mrkit.set_backend(drv)
log = io.StringIO()
mr = mrkit.LoggingAdaptor(mrkit.CudaMemoryResource(), log)
s = mrkit.Stream.create()
blocks = [(mr.allocate(n, s), n) for n in (1000, 20000, 300)]
for p, n in blocks:
    mr.deallocate(p, n, s)
mr.flush()
print(log.getvalue().splitlines()[0])

report = mrkit.replay(log.getvalue(), mrkit.PoolResource(mrkit.CudaMemoryResource()))
print(f"replayed {report.events} events, peak live {report.peak_live_bytes} bytes, pool held {report.held_bytes}")
assert report.peak_live_bytes == 21300
