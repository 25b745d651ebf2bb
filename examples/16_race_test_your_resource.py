"""Race-test your own resource: a budget adaptor written the natural way reads what is in use before
taking its lock. One thread at a time it is correct; two threads can both read the same figure and
both be granted, and the books end up wrong. ``mrkit.testing.race_test`` runs 2-4 threads in
interleavings Hypothesis chooses (every line of your resource that touches shared state, and every
lock acquisition, is a point where the kit may switch threads), finds it, shrinks it to the fewest
switches and prints the interleaving and the call that replays it. The fixed adaptor passes.

Needs: hypothesis"""
import threading

from hypothesis import settings

import mrkit
from mrkit.testing import InterleavingError, race_test


class Budget(mrkit.adaptors.Adaptor):
    """Grants at most ``limit`` bytes at once (yours: any resource built on mrkit's protocol)."""

    def __init__(self, upstream, limit, careful):
        super().__init__(upstream)
        self.limit, self.careful = limit, careful
        self.lock = threading.Lock()  # the kit builds the resource so that this lock is controlled
        self.used = 0

    @property
    def used_bytes(self):
        return self.used

    def allocate(self, nbytes, stream, alignment=256):
        if self.careful:
            with self.lock:  # read, check and add under one lock
                if self.used + nbytes > self.limit:
                    raise mrkit.OutOfMemoryError(f"budget of {self.limit} bytes exceeded", nbytes, self)
                self.used += nbytes
        else:
            used = self.used  # the bug: read before the lock is taken
            if used + nbytes > self.limit:
                raise mrkit.OutOfMemoryError(f"budget of {self.limit} bytes exceeded", nbytes, self)
            with self.lock:
                self.used = used + nbytes
        return self.upstream.allocate(nbytes, stream, alignment)

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        self.upstream.deallocate(ptr, nbytes, stream, alignment)
        with self.lock:
            self.used -= nbytes

    @property
    def live_bytes(self):  # the kit checks it against the blocks it holds, after the threads
        return self.used


def budget(careful):
    return lambda drv: Budget(mrkit.PoolResource(mrkit.CudaMemoryResource(driver=drv)), 8 << 20, careful)


quick = settings(max_examples=15, database=None, deadline=None)
try:
    race_test(budget(careful=False), settings=quick)
except InterleavingError as exc:
    print(exc)
    found = exc
else:
    raise SystemExit("the race test missed the race")
assert "live_bytes" in str(found) and ">>" in str(found) and "Schedule.parse" in str(found)

race_test(budget(careful=True), settings=quick)
print("\nthe careful budget passes the same race test")
