"""A deterministic simulated CUDA device: the second backend of the :class:`~mrkit.driver.Driver`
interface, for CI machines without a GPU and for users testing their own allocation code.

What it models (after the CUDA Driver API reference's memory management, stream ordered allocator,
virtual memory management and unified addressing sections):

* **Devices** with configurable count, memory size, VMM granularity and capabilities
  (:class:`SimDeviceSpec`). Pointers live in one unified address space; bytes are stored sparsely
  so large simulated devices cost nothing until written.
* **Streams are FIFO queues** of operations that run only when the scheduler advances them:
  ``run_all()``, ``step(stream)``, ``run_random(seed)``, or a ``policy`` of ``"manual"`` (default),
  ``"eager"`` (run at once, like a synchronous GPU) or ``"random"`` (a seeded random interleaving
  advanced after every call). Synchronize and query calls advance exactly what they must. Events,
  stream waits, the legacy default stream's implicit synchronisation with blocking streams,
  non-blocking streams, and destruction of streams with pending work (which still completes).
* **A shadow checker.** Every memory operation (memset, memcpy, ``touch``, stream-ordered alloc and
  free, host reads and writes of host-accessible memory) is checked against the access history of the
  bytes it touches using vector clocks: an access conflicts with an earlier one unless the earlier one
  *happens before* it through stream order, events, the default stream, or a synchronisation the host
  observed. Conflicts raise :class:`~mrkit.StreamOrderViolation` naming the kind
  (``use-after-free``, ``use-before-allocation``, ``race``, ``unmapped``, ``not-accessible``,
  ``out-of-bounds``, ``unallocated``) and the history of the ops involved. Because the check is by
  happens-before, not by the interleaving that happened to run, an ordering bug is found on the first
  run; the scheduler's interleavings additionally expose bugs that depend on execution (memory
  unmapped or released while work is pending).
* **Driver calls and their documented errors**: cuMemAlloc/Free, pinned host memory, managed memory
  with advice and prefetch, memory pools (reuse policies, release threshold, trim, attributes,
  access, IPC export/import), VMM (reserve, create, map, set access, unmap, release, address free).

Everything is single-process; the simulator is not thread-safe beyond a global lock around each call.
"""
from __future__ import annotations

import itertools
import random
import threading

from .._base import Driver
from ._model import _ERRORS, _err, _oom, HOST, SimDeviceSpec, _AddressSpace, _Device, _Event, _Handle, _Pool, _Region, _Stream
from ._scheduler import SchedulerMixin
from ._checker import CheckerMixin
from ._streams import StreamsMixin
from ._memory import MemoryMixin
from ._pools import PoolsMixin
from ._vmm import VmmMixin

__all__ = ["SimDriver", "SimDeviceSpec"]


class SimDriver(SchedulerMixin, CheckerMixin, StreamsMixin, MemoryMixin, PoolsMixin, VmmMixin, Driver):
    """The simulated backend.

    Parameters
    ----------
    devices: an int (that many default devices) or a sequence of :class:`SimDeviceSpec`.
    policy: ``"manual"`` (work runs only when the scheduler is advanced or the host synchronises),
        ``"eager"`` (each op runs as soon as it is enqueued and runnable) or ``"random"`` (after
        every call, a seeded random number of random runnable ops run).
    seed: the seed of the ``"random"`` policy and of ``run_random()`` without a seed.
    driver_version: what :meth:`driver_version` reports.
    """

    name = "sim"

    def __init__(self, devices=1, policy: str = "manual", seed: int = 0,
                 driver_version: int = 13000) -> None:
        if isinstance(devices, int):
            if devices < 0:
                raise ValueError(f"devices must be >= 0, got {devices}")
            specs = [SimDeviceSpec() for _ in range(devices)]
        else:
            specs = list(devices)
            if not all(isinstance(s, SimDeviceSpec) for s in specs):
                raise TypeError("devices must be an int or a sequence of SimDeviceSpec")
        if policy not in ("manual", "eager", "random"):
            raise ValueError(f"policy must be 'manual', 'eager' or 'random', got {policy!r}")
        self._devices = [_Device(i, s) for i, s in enumerate(specs)]
        self.policy = policy
        self.rng = random.Random(seed)
        self._version = driver_version
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._uids = itertools.count(1)
        self._handles = itertools.count(0x1000, 0x10)
        self._free_stream_handles: list[int] = []
        self._streams: dict[int, _Stream] = {}
        self._all_streams: list[_Stream] = []
        self._events: dict[int, _Event] = {}
        self._pools: dict[int, _Pool] = {}
        self._vmm: dict[int, _Handle] = {}
        self._space = _AddressSpace(0x7F00_0000_0000, 0x7FFF_0000_0000)
        self._bases: list[int] = []
        self._regions: dict[int, _Region] = {}
        self._graveyard: dict[int, tuple[int, str]] = {}  # freed base -> (size, by whom)
        self._host: dict[int, int] = {HOST: 0}
        self._ipc_exports: dict[int, int] = {}
        self._imported_ptrs: set[int] = set()
        self.checks = 0  # number of accesses checked (for tests of the checker itself)
        self._faults: list[tuple[int, str, tuple[str, ...]]] = []  # (calls to let through, error, calls)
        for d in self._devices:
            uid = next(self._uids)
            d.legacy = _Stream(uid, 0, d.index, blocking=True, legacy=True,
                               label=f"legacy default stream of device {d.index} (id {uid})")
            self._all_streams.append(d.legacy)

    # ================================================================ fault injection
    ALLOCATION_CALLS = ("cuMemAlloc", "cuMemAllocFromPoolAsync", "cuMemCreate", "cuMemHostAlloc",
                        "cuMemAllocManaged")

    def fail_allocation(self, after: int = 0, error: str = "CUDA_ERROR_OUT_OF_MEMORY",
                        calls: tuple[str, ...] | None = None) -> None:
        """Make the driver allocation call after the next ``after`` ones (among ``calls``, default
        all of :attr:`ALLOCATION_CALLS`) fail with ``error``, before it changes anything:
        ``CUDA_ERROR_OUT_OF_MEMORY`` raises :class:`~mrkit.OutOfMemoryError`, any other name a
        :class:`~mrkit.CUDAError`. Each call arms one failure."""
        if error not in _ERRORS:
            raise ValueError(f"error must be one of {sorted(_ERRORS)}, got {error!r}")
        calls = tuple(calls or self.ALLOCATION_CALLS)
        bad = [c for c in calls if c not in self.ALLOCATION_CALLS]
        if bad:
            raise ValueError(f"calls must be among {self.ALLOCATION_CALLS}, got {bad}")
        with self._lock:
            self._faults.append((int(after), error, calls))

    def _injected(self, call: str, nbytes: int) -> None:
        """Raise an armed failure for ``call`` (lock held by the caller)."""
        for i, (left, error, calls) in enumerate(self._faults):
            if call in calls:
                if left > 0:
                    self._faults[i] = (left - 1, error, calls)
                    continue
                del self._faults[i]
                if error == "CUDA_ERROR_OUT_OF_MEMORY":
                    raise _oom(call, nbytes, "a failure injected by SimDriver.fail_allocation")
                raise _err(error, call, "a failure injected by SimDriver.fail_allocation")
