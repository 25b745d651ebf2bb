"""The Python build's CuPy entry point on the GPU (run with MRKIT_NO_EXTENSIONS=1), in one process,
the allocators taking turns round by round: CuPy's own pool; mrkit's allocator over a pool (the
engine's one-frame route); the entry point before it (a dispatcher calling the device's hooks, each
block owned by a CupyBlock); and a Python floor (an allocator returning CuPy's pointer to one fixed
address, no pool behind it). µs per cupy.empty + drop of 256 B, and per array of bench_core's batch."""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cupy  # noqa: E402
from bench_core import empty_batch, empty_pairs  # noqa: E402

from mrkit import DeviceMemoryResource, PoolResource  # noqa: E402
from mrkit._engine import core_description  # noqa: E402
from mrkit.integrations import cupy as mc  # noqa: E402

M, P = cupy.cuda.memory.UnownedMemory, cupy.cuda.memory.MemoryPointer
get_device_id = cupy.cuda.device.get_device_id
hooks = mc.AllocatorHooks(PoolResource(DeviceMemoryResource(0)), cupy.cuda.get_current_stream)
table, bind = hooks.table, hooks.bind
fixed = cupy.cuda.runtime.malloc(1 << 23)


def before(size):
    dev = get_device_id()
    try:
        m, f, _, _ = table[dev]
    except KeyError:
        m, f, _, _ = bind(dev)
    n = (size + 511) & -512
    if n == 0:
        return P(M(0, 0, None, dev), 0)
    ptr = m(n, dev)
    return P(M(ptr, n, mc.CupyBlock(ptr, dev, f), dev), 0)


def floor(size):
    n = (size + 511) & -512
    return P(M(fixed, n, None, get_device_id()), 0)


allocs = {"cupy": cupy.get_default_memory_pool().malloc, "mrkit (route)": mc.allocator(PoolResource(DeviceMemoryResource(0))),
          "mrkit before": before, "python floor": floor}
rng = random.Random(0)
sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]
order = list(range(1000))
rng.shuffle(order)
best: dict = {}
print("core:", core_description())
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 7):
    for name, fn in allocs.items():
        cupy.cuda.set_allocator(fn)
        b = best.setdefault(name, [9e9, 9e9])
        b[0] = min(b[0], empty_pairs(256, 5000))
        b[1] = min(b[1], empty_batch(sizes, order, 2))
cupy.cuda.set_allocator(allocs["cupy"])
c = best["cupy"]
for name, (p, bt) in best.items():
    print(f"{name:15s} pair {p:6.3f} us ({p / c[0]:.2f}x)   batch {bt:6.3f} us ({bt / c[1]:.2f}x)")
