"""The simulator finds a stream-ordering bug deterministically, and accepts the fix.

A block used by a kernel on stream A is handed to stream B without ordering B after A: on a
real GPU this corrupts data only sometimes; mrkit's simulated device reports it every time.
"""
import mrkit
from mrkit.driver import SimDriver

drv = SimDriver(policy="random", seed=1)
a, b = drv.stream_create(0), drv.stream_create(0)
block = drv.mem_alloc(0, 1 << 16)

drv.memset_async(block, 1, 1 << 16, a)  # A's kernel writes the block
try:
    drv.memset_async(block, 2, 1 << 16, b)  # B reuses it with no wait: a race
    raise SystemExit("the race was not found")
except mrkit.StreamOrderViolation as exc:
    print("found:", str(exc).splitlines()[0][:100], "...")

ev = drv.event_create(0)
drv.event_record(ev, a)
drv.stream_wait_event(b, ev)  # the fix: B waits for A
drv.memset_async(block, 2, 1 << 16, b)
drv.run_random(seed=3)  # any interleaving that respects the wait
assert drv.peek(block, 4) == b"\x02" * 4
print("with the event wait: ordered, and the data is B's")
