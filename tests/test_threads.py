"""Threads x streams x release/trim/reclaim: nothing lost, nothing handed out twice.

Each test ends with a conservation check: every block freed, ``release()`` gives every byte back
upstream, and a full-size allocation succeeds afterwards.
"""
from __future__ import annotations

import itertools
import random
import sys
import os
import threading

import pytest

from mrkit import (
    CudaMemoryResource, DeviceMemoryResource, OutOfMemoryError, PoolResource, StatisticsAdaptor, Stream,
    VirtualMemoryResource, VirtualMemoryResourceOptions,
)
from mrkit.driver import SimDeviceSpec, SimDriver

from handouts import HandOuts, race as _race

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _switch_often(switch_often):
    """Every test here runs with thread switches inside the lock-free paths."""


def _worker(mr, stream, seed, ops, errors, handed, sizes=(256, 4096, 65536, MiB)):
    rng = random.Random(seed)
    live = []
    try:
        for _ in range(ops):
            if live and (len(live) > 16 or rng.random() < 0.5):
                p, n = live.pop(rng.randrange(len(live)))
                handed.gave(p)
                mr.deallocate(p, n, stream)
            else:
                n = rng.choice(sizes)
                try:
                    p = mr.allocate(n, stream)
                except OutOfMemoryError:
                    continue
                handed.took(p)
                live.append((p, n))
        for p, n in live:
            handed.gave(p)
            mr.deallocate(p, n, stream)
    except BaseException as exc:  # pragma: no cover - reported by the test
        errors.append(exc)


def _run(mr, drv, threads, ops, churn, sizes=(256, 4096, 65536, MiB), period=0.0, streams=None):
    """``threads`` workers, each on its own stream (made here unless given), and one thread calling
    ``churn()`` in a loop."""
    if streams is None:
        streams = [Stream.create(driver=drv) for _ in range(threads)]
    handed = HandOuts()
    _race([lambda errors, i=i, s=s: _worker(mr, s, i, ops, errors, handed, sizes) for i, s in enumerate(streams)],
          churn, period)
    return streams


def _conserve(pool, upstream_free):
    """Everything freed: release() returns every byte upstream."""
    assert pool.live_bytes == 0
    pool.release()
    assert pool.pool_size == 0, f"{pool.pool_size} bytes stuck in the pool"
    assert upstream_free() == 0


@pytest.mark.parametrize("churn", ["release", "trim"])
def test_release_racing_allocation_loses_nothing(backend, churn):
    drv = backend
    up = CudaMemoryResource(driver=drv)
    pool = PoolResource(up)
    streams = _run(pool, drv, threads=4, ops=1500, churn=getattr(pool, churn))
    # on the simulator every driver allocation is visible; on a GPU the pool's own count must be 0
    _conserve(pool, lambda: sum(s for _, s, k in drv.regions() if k == "device") if drv.name == "sim" else 0)
    free = drv.mem_get_info(0)[0]
    n = free - 64 * MiB  # everything the driver calls free, less some slack
    p = pool.allocate(n, streams[0])  # the whole device is usable again
    pool.deallocate(p, n, streams[0])
    pool.release()
    drv.ctx_synchronize(0)
    for s in streams:
        s.close()


def test_hot_and_cold_sizes_racing_release_lose_nothing():
    """Issue 22: sizes that repeat are cached (lock-free), the others coalesce into the free list when
    freed (under the lock), and a size becomes hot under the lock while other threads free it
    lock-free. Four threads on four streams mix both kinds while release() runs in a loop; at the end
    every byte is back upstream."""
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 30)])
    pool = PoolResource(CudaMemoryResource(driver=drv))
    rng = random.Random(3)
    cold = tuple(rng.randrange(1, 64 * MiB) for _ in range(20000))  # seldom the same size twice
    streams = _run(pool, drv, threads=4, ops=1500, churn=pool.release, sizes=(4096, 65536) * 5000 + cold)
    _conserve(pool, lambda: sum(s for _, s, k in drv.regions() if k == "device"))
    for s in streams:
        s.close()


def test_states_retired_by_release_while_their_threads_run_lose_nothing(monkeypatch):
    """Streams mrkit cannot prove alive (raw handles) have their states retired by every ``release()``
    (their memory is covered by a device synchronise instead); four threads keep allocating and freeing
    on them, hot and cold sizes, while release() runs in a loop. The compiled paths keep the last stream
    state and cache list they found and must see each retirement: nothing is handed out twice and every
    byte goes back upstream."""
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 30)])
    pool = PoolResource(CudaMemoryResource(driver=drv))
    handles = [drv.stream_create(0) for _ in range(4)]
    streams = [Stream.wrap(h, driver=drv) for h in handles]
    assert all(s.alive is None for s in streams)
    from mrkit._engine import _arena
    retired, retire = [0], _arena._StateMethods.retire

    def counted(self, boundaries):
        retired[0] += 1
        retire(self, boundaries)
    monkeypatch.setattr(_arena._StateMethods, "retire", counted)
    rng = random.Random(5)
    cold = tuple(rng.randrange(1, 16 * MiB) for _ in range(5000))
    for _ in range(10):  # how many release() calls land while the workers run depends on the machine
        _run(pool, drv, threads=4, ops=1500, churn=pool.release, sizes=(4096, 65536) * 2500 + cold,
             streams=streams)
        if retired[0] >= 8:
            break
    assert retired[0] >= 8, retired  # the workers' states were retired again and again meanwhile
    _conserve(pool, lambda: sum(s for _, s, k in drv.regions() if k == "device"))
    for h in handles:
        drv.stream_destroy(h)


def test_out_of_memory_reclaim_racing_allocation_loses_nothing():
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=24 * MiB)], policy="eager")
    pool = PoolResource(DeviceMemoryResource(driver=drv))
    streams = _run(pool, drv, threads=4, ops=1500, churn=lambda: None, sizes=(MiB, 2 * MiB, 3 * MiB))
    _conserve(pool, lambda: pool.upstream.pool.used_mem_current)
    p = pool.allocate(20 * MiB, streams[1])
    pool.deallocate(p, 20 * MiB, streams[1])
    pool.release()
    for s in streams:
        s.close()


def test_vmm_trim_racing_allocation_loses_nothing():
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=256 * MiB)], policy="eager")
    vmm = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=1 << 30), driver=drv)
    streams = _run(vmm, drv, threads=4, ops=800, churn=vmm.trim)
    assert vmm.live_bytes == 0
    vmm.trim()
    assert vmm.mapped_bytes == 0 and vmm.physical_bytes == 0
    p = vmm.allocate(200 * MiB, streams[0])
    vmm.deallocate(p, 200 * MiB, streams[0])
    vmm.close()
    for s in streams:
        s.close()


def test_vmm_batches_of_many_small_sizes_racing_trim_lose_nothing():
    """The VMM caches a size of at most two pages that keeps missing within the engine's distance
    (``hot_small``): four threads each run batches of 100 such sizes (allocate all, free in random
    order; far more sizes than the VMM's own distance of 64): one after another, each size misses
    three times and then runs on the lock-free cache; then at once, with ``trim()`` in a loop flushing
    the caches while the threads take from them and put back. At the end nothing is live, mapped or
    held."""
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=2 << 30)], policy="eager")
    vmm = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=8 << 30), driver=drv)
    page = vmm.arena.source.page
    streams = [Stream.create(driver=drv) for _ in range(4)]
    handed, allocations = HandOuts(), []

    def batches(errors, seed, s):
        rng = random.Random(seed)
        sizes = [rng.randrange(1, 2 * page) for _ in range(100)]
        try:
            for _ in range(8):
                ptrs = []
                for n in sizes:
                    p = vmm.allocate(n, s)
                    handed.took(p)
                    ptrs.append((p, n))
                allocations.append(len(ptrs))
                rng.shuffle(ptrs)
                for p, n in ptrs:
                    handed.gave(p)
                    vmm.deallocate(p, n, s)
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    works = [lambda errors, i=i, s=s: batches(errors, i, s) for i, s in enumerate(streams)]
    errors: list = []
    for work in works:  # one after another: each size misses three times, then hits
        work(errors)
    assert not errors and vmm.arena.misses < sum(allocations) // 2
    _race(works, vmm.trim)  # at once, with trim() in a loop flushing the caches
    assert vmm.live_bytes == 0
    vmm.trim()
    assert vmm.mapped_bytes == 0 and vmm.physical_bytes == 0
    vmm.close()
    for s in streams:
        s.close()


@pytest.mark.parametrize("limit", [None, 1.1])
def test_vmm_out_of_memory_moves_racing_allocation_lose_nothing(limit):
    """Issue 22: out of device memory the VMM moves free mappings of any stream into the block (after
    waiting for that stream), releases its larger free runs and, failing that, trims. Four threads on
    four streams ask for far more than a 256 MiB device holds, so every allocation on the edge takes
    that path, while trim() runs beside them; no block is handed out twice, and at the end every page
    is back with the driver."""
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=256 * MiB)], policy="eager")
    vmm = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=4 << 30, footprint_limit=limit),
                                driver=drv)
    streams = _run(vmm, drv, threads=4, ops=600, churn=vmm.trim, period=0.002,
                   sizes=(MiB, 6 * MiB, 20 * MiB, 36 * MiB))
    assert vmm.live_bytes == 0
    vmm.trim()
    assert vmm.mapped_bytes == 0 and vmm.physical_bytes == 0
    vmm.close()
    assert drv.mapped_bytes() == 0 and drv.mem_get_info(0)[0] == 256 * MiB
    for s in streams:
        s.close()


def test_reservation_running_out_beside_non_blocking_trims_loses_nothing():
    """The out-of-memory reclaim's first step under threads: a VMM whose reservation is small (64 MiB)
    runs out of it while ``trim(wait=False)`` sets free mappings aside beside four threads, each on its
    own stream, writing every block it gets (so the set-aside mappings wait for queued work). The
    reclaim takes them back (waits, releases them, returns their ranges to the free lists); a request
    is refused only with an out-of-memory error, no block is handed out twice, and at the end every
    page is back with the driver."""
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=1 << 30)], policy="random", seed=5)
    streams = [Stream.create(driver=drv) for _ in range(4)]
    handed, took_back = HandOuts(), []
    vmm = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=64 * MiB, max_mapping="8 MiB"),
                                driver=drv)
    real = vmm._src.take_back_set_aside

    def take_back(arena):
        got = real(arena)
        took_back.append(got)
        return got

    vmm._src.take_back_set_aside = take_back

    def worker(seed, s, errors):
        rng = random.Random(seed)
        try:
            live = []
            for _ in range(300):
                if live and (len(live) > 2 or rng.random() < 0.4):
                    p, n = live.pop(rng.randrange(len(live)))
                    handed.gave(p)
                    vmm.deallocate(p, n, s)
                    continue
                n = rng.randint(1, 12 * MiB)
                try:
                    p = vmm.allocate(n, s)
                except OutOfMemoryError:
                    continue
                handed.took(p)
                drv.memset_async(p, 1, n, s.handle)
                live.append((p, n))
            for p, n in live:
                handed.gave(p)
                vmm.deallocate(p, n, s)
        except BaseException as exc:  # pragma: no cover - reported by _race
            errors.append(exc)

    _race([lambda errors, i=i, s=s: worker(i, s, errors) for i, s in enumerate(streams)],
          lambda: vmm.trim(wait=False), period=0.0005)
    assert any(took_back)  # the reclaim found set-aside mappings and took them back
    assert vmm.live_bytes == 0
    vmm.trim()
    assert vmm.mapped_bytes == 0 and vmm.physical_bytes == 0
    vmm.close()
    assert drv.mapped_bytes() == 0 and drv.mem_get_info(0)[0] == 1 << 30


def test_footprint_limit_refusal_path_racing_allocation_loses_nothing():
    """Issue 33's refusal path under threads: with ``footprint_limit=1.0`` a request past the bound
    first releases what a non-blocking trim set aside, takes the other streams' free memory over
    (waiting for them) and tries the place where the fewest pages must be created. Four threads, each
    on its own stream, scatter small blocks, free them and ask for one larger than all of them (the
    memory they need lies in the other streams' free lists), while ``trim(wait=False)`` and ``trim()``
    take turns beside them: the path runs, no block is handed out twice, and at the end of each round
    every page is back with the driver. Each round is a new resource: the bound's high-water mark
    starts from nothing, so its first large requests are the ones the bound bites (on one resource the
    mark soon allows them all, and whether the path ran depended on the threads' interleaving)."""
    drv = SimDriver(devices=[SimDeviceSpec(total_memory=1 << 30)], policy="eager")
    streams = [Stream.create(driver=drv) for _ in range(4)]
    handed, retried = HandOuts(), []

    def one_round(rnd):
        vmm = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=4 << 30, footprint_limit=1.0,
                                                                    max_mapping="16 MiB"), driver=drv)
        real_fit = vmm._src._fit_fewest_missing

        def fit(*a):
            retried.append(rnd)
            return real_fit(*a)

        vmm._src._fit_fewest_missing = fit  # counts the refusal path's retries

        def worker(seed, s, errors):
            rng = random.Random(seed)
            try:
                for _ in range(400):
                    small = []
                    for n in (rng.randint(1, 3 * MiB) for _ in range(3)):
                        try:  # a new resource's bound is tight: a small request may be refused too
                            small.append((vmm.allocate(n, s), n))
                        except OutOfMemoryError as exc:
                            assert "footprint_limit" in str(exc), exc
                    for p, n in small:
                        handed.took(p)
                    for p, n in small:
                        handed.gave(p)
                        vmm.deallocate(p, n, s)
                    n = rng.randint(8 * MiB, 24 * MiB)
                    try:
                        p = vmm.allocate(n, s)
                    except OutOfMemoryError as exc:
                        assert "footprint_limit" in str(exc), exc
                        continue
                    handed.took(p)
                    handed.gave(p)
                    vmm.deallocate(p, n, s)
            except BaseException as exc:  # pragma: no cover - reported by _race
                errors.append(exc)

        turn = itertools.count()
        _race([lambda errors, i=i, s=s: worker(10 * rnd + i, s, errors) for i, s in enumerate(streams)],
              lambda: vmm.trim(wait=next(turn) % 2 == 0), period=0.001)
        assert vmm.live_bytes == 0
        vmm.trim()
        assert vmm.mapped_bytes == 0 and vmm.physical_bytes == 0
        vmm.close()
        assert drv.mapped_bytes() == 0 and drv.mem_get_info(0)[0] == 1 << 30

    for rnd in range(40):  # until the path has run in a few rounds (a round takes tens of milliseconds)
        one_round(rnd)
        if len(set(retried)) >= 3:
            break
    assert retried, "the refusal path never ran"
    for s in streams:
        s.close()


GPU_OPS = int(os.environ.get("MRKIT_THREAD_OPS", "100000"))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["pool(device)", "vmm"])
def test_eight_threads_with_release_every_millisecond_on_the_gpu(gpu, kind):
    """The issue's proof on the real driver: 8 threads x MRKIT_THREAD_OPS operations (100 000 by
    default), release()/trim() every millisecond; then 0 bytes lost and 0 double hand-outs."""
    sys.setswitchinterval(0.005)  # real threads: the driver calls release the GIL anyway
    if kind == "vmm":
        mr = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=64 << 30), driver=gpu)
    else:
        mr = PoolResource(DeviceMemoryResource(0, driver=gpu))
    streams = _run(mr, gpu, threads=8, ops=GPU_OPS, churn=mr.release, period=0.001)
    assert mr.live_bytes == 0
    mr.release()
    if kind == "vmm":
        assert mr.mapped_bytes == 0 and mr.physical_bytes == 0
    else:
        assert mr.pool_size == 0
    big = 32 << 30
    p = mr.allocate(big, streams[0])  # the device is whole again
    mr.deallocate(p, big, streams[0])
    mr.release()
    gpu.ctx_synchronize(0)
    mr.close()
    for s in streams:
        s.close()


def test_binning_release_racing_allocation_loses_nothing():
    from mrkit import BinningResource
    drv = SimDriver(policy="eager")
    mr = BinningResource(CudaMemoryResource(driver=drv), "64 KiB", chunk_size="1 MiB")
    streams = _run(mr, drv, threads=4, ops=1000, churn=mr.release, sizes=(100, 3000, 65536, 2 * MiB))
    assert mr.live_bytes == 0
    mr.release()
    assert mr.pool_size == 0 and sum(s for _, s, k in drv.regions() if k == "device") == 0
    for s in streams:
        s.close()


def test_host_view_under_concurrent_allocation():
    from mrkit import DEFAULT_STREAM, HostMemoryResource
    mr = HostMemoryResource()
    p = mr.allocate(4096, DEFAULT_STREAM)
    stop = threading.Event()
    errors = []

    def churn():
        while not stop.is_set():
            q = [mr.allocate(256, DEFAULT_STREAM) for _ in range(20)]
            for x in q:
                mr.deallocate(x, 256, DEFAULT_STREAM)

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(3000):
            try:
                mr.view(p, 4096)[0] = 1
            except RuntimeError as exc:  # "dictionary changed size during iteration"
                errors.append(exc)
                break
    finally:
        stop.set()
        t.join()
    mr.deallocate(p, 4096, DEFAULT_STREAM)
    assert not errors, errors[0]


def test_binning_block_reused_by_another_thread_during_its_free_keeps_its_new_owner():
    """The window the GPU run found: a binned block went back to the arena before its size record
    was dropped, so a thread handed the same address in between lost its record (and its free)."""
    from mrkit import BinningResource
    drv = SimDriver(policy="eager")
    mr = BinningResource(CudaMemoryResource(driver=drv), "64 KiB", chunk_size="1 MiB")
    s = Stream.create(driver=drv)
    a = mr.allocate(1000, s)
    real, got = mr._bin_free, []

    def free_then_another_thread_allocates(ptr, n, stream):
        real(ptr, n, stream)
        t = threading.Thread(target=lambda: got.append(mr.allocate(1000, stream)))
        t.start()
        t.join()

    mr._bin_free = free_then_another_thread_allocates
    mr.deallocate(a, 1000, s)
    mr._bin_free = real
    assert got == [a]  # same stream: the block is reused at once
    mr.deallocate(got[0], 1000, s)  # the new owner's free is accepted
    assert mr.live_bytes == 0
    mr.release()
    assert mr.pool_size == 0


def test_statistics_over_a_pool_racing_release_and_uncounted_frees_lose_nothing():
    """Issue 35: the statistics adaptor keeps a table of the blocks it counted, beside the pool's fused
    lock-free path. Four threads allocate and free through it on four streams while another thread
    releases the pool and frees, through the adaptor, blocks it took from the pool directly (and one
    with a larger alignment). The counters end at zero, never having counted an uncounted free, and
    every byte is back upstream."""
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 30)])
    pool = PoolResource(CudaMemoryResource(driver=drv))
    stats = StatisticsAdaptor(pool)
    side = Stream.create(driver=drv)
    uncounted = [0]

    def churn():
        pool.release()
        p = pool.allocate(4096, side)  # around the adaptor: its free must not be counted
        stats.deallocate(p, 4096, side)
        q = pool.allocate(5000, side, 4096)
        stats.deallocate(q, 5000, side, 4096)
        uncounted[0] += 2

    streams = _run(stats, drv, threads=4, ops=1500, churn=churn)
    st = stats.statistics
    assert uncounted[0] > 0
    assert (st.current_bytes, st.current_count) == (0, 0) and st.peak_bytes > 0
    assert st.total_count > 0 and not stats._counted
    _conserve(pool, lambda: sum(s for _, s, k in drv.regions() if k == "device"))
    for s in streams + [side]:
        s.close()


# -- a stream closed by its own thread while another thread's allocation or release orders after it ----
def _closed_from_another_thread_during(drv, call: str, stream: Stream) -> list:
    """Patch ``drv.<call>`` so that, the first time it is called with ``stream``'s handle, another
    thread closes ``stream`` just before the call goes through (given 0.2 s: a close that waits for
    mrkit to finish with the stream shows as a closer still running). Returns ``[closer thread]``."""
    real, closer = getattr(drv, call), []

    def patched(*args, **kwargs):
        if stream.handle in args and not closer:
            t = threading.Thread(target=stream.close)
            closer.append(t)
            t.start()
            t.join(0.2)
        return real(*args, **kwargs)

    setattr(drv, call, patched)
    return closer


def _pool_of_4_mib(drv):
    return PoolResource(CudaMemoryResource(driver=drv), initial_size=4 * MiB, maximum_size=4 * MiB)


def test_a_stream_closed_while_an_allocation_takes_its_free_memory_over_loses_nothing():
    """A thread frees 3 MiB on its stream and closes the stream just as another thread's allocation
    takes that memory over (the pool has no other): the hand-over's event was recorded on the destroyed
    stream (``CUDA_ERROR_INVALID_HANDLE``, or on a new stream that reused the handle). The stream is
    held open for the event; the close completes after it."""
    drv = SimDriver(policy="eager")
    pool = _pool_of_4_mib(drv)
    s = Stream.create(driver=drv)
    p = pool.allocate(3 * MiB, s)
    pool.deallocate(p, 3 * MiB, s)
    closer = _closed_from_another_thread_during(drv, "event_record", s)
    q = pool.allocate(3 * MiB, Stream.create(driver=drv))
    closer[0].join()
    assert q == p and s.alive is False
    pool.deallocate(q, 3 * MiB, s)  # freed on the closed stream: accepted
    _conserve(pool, lambda: sum(n for _, n, k in drv.regions() if k == "device"))


@pytest.mark.parametrize("make", [pytest.param(_pool_of_4_mib, id="pool"),
                                  pytest.param(lambda drv: VirtualMemoryResource(driver=drv), id="vmm")])
def test_a_stream_closed_while_release_waits_for_it_loses_nothing(make):
    """``release()`` synchronises every stream holding free memory; a thread closes one of them in
    between: the wait reached a destroyed stream. It now waits for the device instead (or the stream is
    held open for the wait), and every byte goes back."""
    drv = SimDriver(policy="eager")
    mr = make(drv)
    s = Stream.create(driver=drv)
    p = mr.allocate(MiB + 4096, s)
    mr.deallocate(p, MiB + 4096, s)
    closer = _closed_from_another_thread_during(drv, "stream_synchronize", s)
    mr.release()
    closer[0].join()
    assert s.alive is False and mr.live_bytes == 0
    if isinstance(mr, PoolResource):
        _conserve(mr, lambda: sum(n for _, n, k in drv.regions() if k == "device"))
    else:
        assert mr.mapped_bytes == 0


def test_a_stream_closed_while_a_non_blocking_trim_records_its_event_loses_nothing():
    """``trim(wait=False)`` records one event on each stream holding free mappings; a thread closes the
    stream in between. The stream is held open for the event, and a later trim releases everything."""
    drv = SimDriver(policy="eager")
    mr = VirtualMemoryResource(driver=drv)
    s = Stream.create(driver=drv)
    p = mr.allocate(8 * MiB, s)
    mr.deallocate(p, 8 * MiB, s)
    closer = _closed_from_another_thread_during(drv, "event_record", s)
    mr.trim(wait=False)
    closer[0].join()
    assert s.alive is False
    mr.trim()
    assert mr.live_bytes == 0 and mr.mapped_bytes == 0


def _close_streams_beside_release(mr, drv, threads: int, rounds: int, period: float = 0.0) -> None:
    """``threads`` threads each make a stream, allocate on it, free some blocks on a second stream
    ordered after it and some on the first after closing it, then close both, ``rounds`` times, while
    another thread releases ``mr`` every ``period`` seconds: no error, nothing handed out twice,
    nothing live at the end."""
    handed = HandOuts()

    def worker(errors, seed):
        rng = random.Random(seed)
        try:
            for _ in range(rounds):
                s, other = Stream.create(driver=drv), Stream.create(driver=drv)
                blocks = [(mr.allocate(n, s), n) for n in (rng.randrange(1, 1 << 18) for _ in range(rng.randrange(1, 12)))]
                for p, _ in blocks:
                    handed.took(p)
                rng.shuffle(blocks)
                for i, (p, n) in enumerate(blocks):
                    handed.gave(p)
                    if i % 2 == 0 and s.alive:
                        other.wait(s)
                        mr.deallocate(p, n, other)
                    else:
                        s.close()
                        mr.deallocate(p, n, s)
                s.close()
                other.close()
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    _race([lambda errors, i=i: worker(errors, i) for i in range(threads)], mr.release, period)
    assert mr.live_bytes == 0
    mr.release()


@pytest.mark.parametrize("make", [
    pytest.param(lambda drv: PoolResource(CudaMemoryResource(driver=drv)), id="pool"),
    pytest.param(lambda drv: PoolResource(DeviceMemoryResource(0, driver=drv)), id="pool(device)"),
    pytest.param(lambda drv: VirtualMemoryResource(driver=drv), id="vmm"),
])
def test_threads_closing_their_streams_beside_release_lose_nothing(make):
    """Six threads closing the streams their blocks were freed on, beside a thread releasing: every
    byte back upstream (over the driver's pool, a chunk goes back with ``cuMemFreeAsync`` on the stream
    that freed it last, which its thread may be closing)."""
    drv = SimDriver([SimDeviceSpec(total_memory=1 << 30)])
    mr = make(drv)
    _close_streams_beside_release(mr, drv, threads=6, rounds=60)
    if isinstance(mr, PoolResource):
        assert mr.pool_size == 0 and mr.upstream.live_bytes == 0
    else:
        assert mr.mapped_bytes == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["pool(device)", "vmm"])
def test_threads_closing_their_streams_beside_release_on_the_gpu(gpu, kind):
    """The same on the real driver, where a destroyed stream's handle is reused by the next stream
    made: 8 threads x 100 rounds, release() every millisecond (in a loop without a pause, the releasing
    thread keeps the lock from the others, and the VMM maps everything anew each time); then nothing
    held."""
    sys.setswitchinterval(0.005)
    if kind == "vmm":
        mr = VirtualMemoryResource(0, VirtualMemoryResourceOptions(reserve_size=64 << 30), driver=gpu)
    else:
        mr = PoolResource(DeviceMemoryResource(0, driver=gpu))
    _close_streams_beside_release(mr, gpu, threads=8, rounds=100, period=0.001)
    if kind == "vmm":
        assert mr.mapped_bytes == 0 and mr.physical_bytes == 0
    else:
        assert mr.pool_size == 0
    gpu.ctx_synchronize(0)
    mr.close()


def test_a_stream_closed_while_its_whole_chunk_goes_back_upstream_loses_nothing():
    """A chunk wholly free in another thread's stream state goes back to the driver's pool with
    ``cuMemFreeAsync`` on that stream; the thread closes it at that moment. The stream is held open for
    the free (the driver pool's own check of ``alive`` would otherwise be stale)."""
    drv = SimDriver(policy="eager")
    s = Stream.create(driver=drv)
    closer = _closed_from_another_thread_during(drv, "mem_free_async", s)  # before the resource binds it
    pool = PoolResource(DeviceMemoryResource(0, driver=drv), initial_size=4 * MiB, maximum_size=4 * MiB)
    p = pool.allocate(4 * MiB, s)
    pool.deallocate(p, 4 * MiB, s)
    arena = pool.arena
    with arena.lock:
        assert arena.release_free_chunks(arena.state(s)) == 4 * MiB
    closer[0].join()
    assert s.alive is False and pool.pool_size == 0 and pool.upstream.live_bytes == 0
