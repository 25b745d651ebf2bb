"""Where the Python build's ``cupy.empty`` batch goes on the GPU (run with MRKIT_NO_EXTENSIONS=1):
bench_core.py's batch of 1 000 sizes, round by round, with the pool's misses (``Arena.take`` calls)
and the garbage collector's collections counted (full ones, and the time in the collector), then one
round under cProfile. CuPy's own pool beside it in the same process, which imports PyTorch when it is
there, as bench_core.py's does (the collector's full collections cost in proportion to the heap)."""
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cupy  # noqa: E402

try:
    import torch  # noqa: F401,E402
except ImportError:
    pass
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
collections = [0, 0, 0.0, 0.0]  # collections, full ones, seconds in the collector, start of the current one


def _count(phase, info):
    if phase == "start":
        collections[0] += 1
        collections[1] += info["generation"] == 2
        collections[3] = time.perf_counter()
    else:
        collections[2] += time.perf_counter() - collections[3]


gc.callbacks.append(_count)
print("objects the collector tracks:", len(gc.get_objects()), " thresholds:", gc.get_threshold())
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
        misses[0] = 0
        collections[:3] = [0, 0, 0.0]
        t = empty_batch(sizes, order, 2)
        p = empty_pairs(256, 3000)
        print(f"round {r} {name:6s} batch {t * 1000:7.0f} ns/array  pair {p * 1000:6.0f} ns  misses {misses[0]:5d}  "
              f"gc {collections[0]} (full {collections[1]}, {collections[2] * 1e3:.1f} ms)", flush=True)
cupy.cuda.set_allocator(allocs["mrkit"])
import cProfile  # noqa: E402
import pstats  # noqa: E402
cProfile.run("empty_batch(sizes, order, 4)", "/tmp/py_batch.prof")
pstats.Stats("/tmp/py_batch.prof").sort_stats("tottime").print_stats(12)
