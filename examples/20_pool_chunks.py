"""How the pool grows: chunks of 32 MiB for requests of a few MiB. RMM's random workload to 8 MiB (half
allocations, half frees of a random live block) through two pools on one simulated device: the default,
whose requests of more than 1 MiB and less than ``large_chunk`` take a chunk of 32 MiB each time the pool
must grow (as PyTorch's caching allocator takes 20 MiB segments), and ``large_chunk=0``, which grows by
each request alone. Blocks never coalesce across chunks, so a chunk per request leaves as many separate
free blocks as it made chunks; shared chunks let free neighbours join. Both pools hold about the same
memory at the end, the default in a fifth as many chunks, and both give every byte back on release."""
import random

import mrkit
from mrkit.driver import SimDeviceSpec, SimDriver

MiB = 1 << 20
drv = SimDriver([SimDeviceSpec(total_memory=64 << 30)])
s = mrkit.DEFAULT_STREAM


def workload(pool, passes=6, ops=4000):
    """RMM's random workload on ``pool``, new sizes each pass; every block freed at the end."""
    for k in range(passes):
        rng, live = random.Random(k), []
        for _ in range(ops):
            if rng.random() < 0.5 or not live:
                n = rng.randint(1, 8 * MiB)
                live.append((pool.allocate(n, s), n))
            else:
                p, n = live.pop(rng.randrange(len(live)))
                pool.deallocate(p, n, s)
        for p, n in live:
            pool.deallocate(p, n, s)


shared = mrkit.PoolResource(mrkit.CudaMemoryResource(driver=drv))  # large_chunk="32 MiB"
apart = mrkit.PoolResource(mrkit.CudaMemoryResource(driver=drv), large_chunk=0)
rows = {}
for name, pool in (("large_chunk=32 MiB", shared), ("large_chunk=0", apart)):
    workload(pool)
    st = pool.arena.states[s.uid]
    st.flush(pool.arena.boundaries)  # every cached block into the free list, coalesced
    rows[name] = (pool.pool_size, len(pool.arena.chunks), len(st.free))
    print(f"{name:20s} holds {pool.pool_size / MiB:7.0f} MiB in {rows[name][1]:4d} chunks, "
          f"{rows[name][2]:4d} free blocks")
(held_s, chunks_s, free_s), (held_a, chunks_a, free_a) = rows.values()
assert chunks_s * 3 < chunks_a and free_s * 3 < free_a, rows  # far fewer chunks and free blocks
assert held_s < 1.1 * held_a, rows  # at about the same footprint
for pool in (shared, apart):
    pool.release()
    assert pool.pool_size == 0
assert drv.mem_get_info(0)[0] == 64 << 30  # every byte back with the driver
print("every byte back upstream")
