"""Many threads allocating on short-lived streams of their own while another thread calls release()
every millisecond: each thread closes its stream while the pool still holds memory freed on it (the
release, or another thread's allocation taking that memory over, holds the stream open for the driver
calls it makes on it). Afterwards every byte is back upstream, and no thread saw an error. A last
allocation on a closed stream is refused with a ValueError that names it, and changes nothing.

Runs on a GPU if there is one, else on mrkit's simulated device:  python examples/08_threads_and_release.py
"""
import random
import threading

import mrkit
from mrkit.driver import CudaDriver, SimDriver


def pick_driver():
    try:
        if CudaDriver().device_count() > 0:
            return CudaDriver()
    except mrkit.CUDAUnavailableError:
        pass
    return SimDriver(policy="eager")


drv = pick_driver()
mrkit.set_backend(drv)
pool = mrkit.PoolResource(mrkit.DeviceMemoryResource(driver=drv))
bins = mrkit.BinningResource(mrkit.DeviceMemoryResource(driver=drv), "64 KiB")
done = threading.Event()


errors = []


def work(mr, seed):
    rng = random.Random(seed)
    try:
        for _ in range(20):  # 20 streams in turn, 100 operations each
            live = []
            with mrkit.Stream.create(driver=drv) as s:
                for _ in range(100):
                    if live and rng.random() < 0.5:
                        mr.deallocate(*live.pop(), s)
                    else:
                        n = rng.choice([256, 5000, 1 << 20])
                        live.append((mr.allocate(n, s), n))
                for p, n in live:
                    mr.deallocate(p, n, s)
            # s is closed here; the pool may still hold what was freed on it
        mr.release()  # waits for the streams' work before giving chunks back
    except BaseException as exc:
        errors.append(exc)


def releaser():
    while not done.wait(0.001):
        pool.release()
        bins.release()


r = threading.Thread(target=releaser)
r.start()
workers = [threading.Thread(target=work, args=(mr, i)) for i, mr in enumerate([pool, bins] * 2)]
for w in workers:
    w.start()
for w in workers:
    w.join()
done.set()
r.join()
pool.release()
bins.release()
assert not errors, errors[0]
assert pool.live_bytes == 0 and pool.pool_size == 0, pool.pool_size
assert bins.live_bytes == 0 and bins.pool_size == 0, bins.pool_size
print(f"4 threads x 20 streams x 100 operations with release() every millisecond on {drv.name}: "
      f"nothing lost (pool holds {pool.pool_size} bytes, binning {bins.pool_size})")

s = mrkit.Stream.create(driver=drv)
s.close()
try:
    pool.allocate(1 << 20, s)  # would grow from the driver pool on a destroyed stream
    raise SystemExit("an allocation on a closed stream must be refused")
except ValueError as exc:
    assert "is closed" in str(exc), exc
assert pool.live_bytes == 0 and pool.pool_size == 0
print("an allocation on a closed stream: ValueError, nothing changed")
