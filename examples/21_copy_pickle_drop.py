"""Copying, pickling and dropping what mrkit hands you: resources are shared, buffers are copied by
value, and a pool dropped without close() gives its memory back.

A training configuration holding a pool is deep-copied (the copy shares the pool: two pools owning one
chunk would free it twice); a buffer is copied with ``copy.copy`` and its original freed and reused
(the copy keeps its bytes); a resource refuses pickling with a TypeError naming it; a buffer pickles as
its bytes into the current resource of whoever unpickles it; a pool per trial, each dropped without
close(), gives its chunks back when the next pool is built, and a log dropped without close() still
writes its events; a pool and its log in ``with`` blocks close at the end of them, and an error inside
stays the error raised. At the end every byte is back upstream.

Runs on a GPU if there is one, else on mrkit's simulated device:  python examples/21_copy_pickle_drop.py
"""
import copy
import gc
import os
import pickle
import tempfile

import mrkit

drv = mrkit.get_driver()  # the GPU if there is one, else the simulated device (with one warning)
base = mrkit.TrackingAdaptor(mrkit.CudaMemoryResource(driver=drv))  # what the pool holds upstream
pool = mrkit.TrackingAdaptor(mrkit.PoolResource(base))               # what users hold from the pool

config = {"mr": pool, "batch_sizes": [32, 64], "name": "run-1"}
trial = copy.deepcopy(config)
trial["batch_sizes"].append(128)
assert trial["mr"] is pool and config["batch_sizes"] == [32, 64]
print("deepcopy of a config: the pool is shared, the rest copied")

weights = mrkit.Buffer.from_bytes(bytes(range(256)) * 64, pool)
backup = copy.copy(weights)
weights.close()
scratch = mrkit.Buffer.from_bytes(b"\xff" * weights.size, pool)  # may reuse the freed block
assert backup.tobytes() == bytes(range(256)) * 64 and backup.ptr != weights.ptr
print(f"copy.copy(buffer): a new block at {backup.ptr:#x} with the same {backup.size} bytes")

try:
    pickle.dumps(config)
    raise SystemExit("a resource must not pickle")
except TypeError as exc:
    print(f"pickle.dumps(config): TypeError: {str(exc)[:60]}...")

other = mrkit.TrackingAdaptor(mrkit.CudaMemoryResource(driver=drv))
with mrkit.using(other):
    received = pickle.loads(pickle.dumps(backup))
assert received.resource is other and received.tobytes() == backup.tobytes()
print("pickle of a buffer: its bytes, unpickled into the current resource")

for buf in (backup, scratch, received):
    buf.close()
pool.upstream.release()
assert pool.outstanding() == {} and other.outstanding() == {} and base.outstanding() == {}
print("every block freed once and every byte back upstream")

log_path = os.path.join(tempfile.mkdtemp(), "trials.csv")
for trial in range(5):  # a fresh pool per trial, never closed: the old one's chunks go back
    trial_pool = mrkit.LoggingAdaptor(mrkit.PoolResource(base), log_path if trial == 4 else os.devnull)
    ptr = trial_pool.allocate(8 << 20, mrkit.DEFAULT_STREAM)
    trial_pool.deallocate(ptr, 8 << 20, mrkit.DEFAULT_STREAM)
    held = sum(base.outstanding().values())
    assert held <= 2 * (32 << 20), f"trial {trial}: {held} bytes held upstream: dropped pools kept theirs"
del trial_pool
gc.collect()
mrkit.PoolResource(base)  # building a pool gives back what dropped ones held
assert base.outstanding() == {}
assert [e.action for e in mrkit.read_log(log_path)] == ["allocate", "free"]
print("5 pools dropped without close(): every chunk back upstream, the last one's log written")

with mrkit.LoggingAdaptor(base, log_path) as lg, mrkit.PoolResource(lg) as scoped:  # closed in turn on the way out
    ptr = scoped.allocate(1 << 20, mrkit.DEFAULT_STREAM)
    scoped.deallocate(ptr, 1 << 20, mrkit.DEFAULT_STREAM)
assert lg.closed and base.outstanding() == {}
assert [e.action for e in mrkit.read_log(log_path)] == ["allocate", "free"]  # the pool's one chunk
try:
    with mrkit.PoolResource(base) as scoped:
        ptr = scoped.allocate(1 << 20, mrkit.DEFAULT_STREAM)
        raise KeyError("an error of the caller's")
except KeyError:
    pass  # not replaced by close()'s refusal: the block is still live, and valid
scoped.deallocate(ptr, 1 << 20, mrkit.DEFAULT_STREAM)
scoped.close()
assert base.outstanding() == {}
print("with blocks: pool and log closed on the way out, every byte back upstream")
