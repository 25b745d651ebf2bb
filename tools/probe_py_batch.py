"""Where the Python build's ``cupy.empty`` batch goes on the GPU (run with MRKIT_NO_EXTENSIONS=1):
bench_core.py's batch of 1 000 sizes, round by round, with the pool's misses (``Arena.take`` calls)
and the garbage collector's collections counted, then one round under cProfile. CuPy's own pool
beside it in the same process."""
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cupy  # noqa: E402
from bench_core import empty_batch, empty_pairs  # noqa: E402

import mrkit.cupy  # noqa: E402
from mrkit import DeviceMemoryResource, PoolResource  # noqa: E402
from mrkit._engine import _arena, core_description  # noqa: E402

misses = [0]
_take = _arena.Arena.take


def take(self, size, stream):
    misses[0] += 1
    return _take(self, size, stream)


_arena.Arena.take = take
collections = [0]
gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start")))
rng = random.Random(0)
sizes = [int(2 ** rng.uniform(8, 22)) for _ in range(1000)]
order = list(range(1000))
rng.shuffle(order)
print("core:", core_description())
allocs = {"cupy": cupy.get_default_memory_pool().malloc,
          "mrkit": mrkit.cupy.allocator(PoolResource(DeviceMemoryResource(0)))}
for r in range(6):
    for name, fn in allocs.items():
        cupy.cuda.set_allocator(fn)
        misses[0] = collections[0] = 0
        t = empty_batch(sizes, order, 2)
        p = empty_pairs(256, 3000)
        print(f"round {r} {name:6s} batch {t * 1000:7.0f} ns/array  pair {p * 1000:6.0f} ns  misses {misses[0]:5d}  "
              f"gc {collections[0]}", flush=True)
cupy.cuda.set_allocator(allocs["mrkit"])
import cProfile  # noqa: E402
import pstats  # noqa: E402
cProfile.run("empty_batch(sizes, order, 4)", "/tmp/py_batch.prof")
pstats.Stats("/tmp/py_batch.prof").sort_stats("tottime").print_stats(12)
