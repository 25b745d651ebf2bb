"""Buffers in reference cycles, freed by the garbage collector at any moment, even while their own
thread is inside the pool (a miss, the pool growing): nothing hangs, nothing is lost.

Four threads allocate; a third of their buffers are left in reference cycles for the collector, which
runs often (a low threshold) and so runs inside the pool's locked steps too. Such a free is queued
and applied when the step ends (this used to hang the process for good).

Runs on a GPU if there is one, else on mrkit's simulated device:  python examples/19_buffers_the_collector_frees.py
"""
import gc
import random
import threading

import mrkit


class Node:
    """A buffer's holder in a reference cycle: only the collector frees it."""

    def __init__(self, buf):
        self.buf, self.me = buf, self


drv = mrkit.get_driver()  # the GPU if there is one, else the simulated device (with one warning)
pool = mrkit.PoolResource(mrkit.DeviceMemoryResource(driver=drv))


def work(seed):
    rng, kept = random.Random(seed), []
    s = mrkit.DEFAULT_STREAM
    for _ in range(1500):
        n = rng.choice([256, 5000, 1 << 20, (3 << 20) + rng.randrange(1 << 20)])
        buf = mrkit.Buffer(pool.allocate(n, s), n, pool, s)
        if rng.random() < 0.33:
            Node(buf)  # garbage in a cycle: the collector closes the buffer, whenever it runs
        else:
            kept.append(buf)
        if len(kept) > 20:
            kept.pop(rng.randrange(len(kept))).close()
    for buf in kept:
        buf.close()


old = gc.get_threshold()
gc.set_threshold(50, 2, 2)
try:
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
finally:
    gc.set_threshold(*old)
gc.collect()
print(f"live after the collector: {pool.live_bytes} B; pool holds {pool.pool_size} B")
assert pool.live_bytes == 0, pool.live_bytes
pool.release()
assert pool.pool_size == 0, pool.pool_size
print("every byte back upstream")
