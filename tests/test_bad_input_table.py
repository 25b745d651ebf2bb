"""The bad-input table: every public entry point, each bad input, the precise error it gets, a
message naming the argument, and the state unchanged afterwards (counters, free lists, live tables,
logs). Runs on the simulator."""
from __future__ import annotations

import io

import numpy as np
import pytest

import mrkit
from mrkit import (
    DEFAULT_STREAM, BinningResource, Buffer, CudaMemoryResource, DeviceMemoryResource, HostMemoryResource,
    LimitingAdaptor, LoggingAdaptor, ManagedMemoryResource, OutOfMemoryError, PinnedMemoryResource, PoolResource,
    StatisticsAdaptor, Stream, TrackingAdaptor, VirtualMemoryResource,
)
from mrkit.driver import SimDriver, set_backend

MiB = 1 << 20

# -- the resources under test: each factory builds one on the current (simulated) driver -------------
RESOURCES = {
    "device": lambda: DeviceMemoryResource(0),
    "cuda": lambda: CudaMemoryResource(0),
    "managed": lambda: ManagedMemoryResource(0),
    "pinned": lambda: PinnedMemoryResource(),
    "host": lambda: HostMemoryResource(),
    "pool": lambda: PoolResource(CudaMemoryResource(0), initial_size="4 MiB"),
    "vmm": lambda: VirtualMemoryResource(0),
    "binning": lambda: BinningResource(CudaMemoryResource(0), "64 KiB"),
    "statistics": lambda: StatisticsAdaptor(PoolResource(CudaMemoryResource(0))),
    "limiting": lambda: LimitingAdaptor(CudaMemoryResource(0), "64 MiB"),
    "tracking": lambda: TrackingAdaptor(CudaMemoryResource(0)),
    "logging": lambda: LoggingAdaptor(CudaMemoryResource(0), io.StringIO(), buffer_lines=1),
    # compositions: an adaptor's own table in front of a caching resource's
    "tracking(pool)": lambda: TrackingAdaptor(PoolResource(CudaMemoryResource(0))),
    "logging(tracking(vmm))": lambda: LoggingAdaptor(TrackingAdaptor(VirtualMemoryResource(0)), io.StringIO(),
                                                     buffer_lines=1),
    "limiting(statistics(binning))": lambda: LimitingAdaptor(
        StatisticsAdaptor(BinningResource(CudaMemoryResource(0), "64 KiB")), "64 MiB"),
}


def _state(mr):
    """Everything observable that a refused call must leave alone."""
    out = {"live": getattr(mr, "live_bytes", None), "pool": getattr(mr, "pool_size", None)}
    if isinstance(mr, StatisticsAdaptor):
        st = mr.statistics
        out["stats"] = (st.current_bytes, st.current_count, st.total_bytes, st.total_count, st.peak_bytes)
    if isinstance(mr, LimitingAdaptor):
        out["used"] = mr.used_bytes
    outstanding = getattr(mr, "outstanding", None)
    if callable(outstanding):  # the tables' keys with their types: a float key equal to a pointer is a change
        out["outstanding"] = sorted((p, type(p).__name__, n, type(n).__name__) for p, n in outstanding().items())
    if isinstance(mr, LoggingAdaptor):
        mr.flush()
        out["log"] = mr._file.getvalue()
    up = getattr(mr, "upstream", None)
    if up is not None:
        out["upstream"] = _state(up)
    return out


class _Closed:
    """A stream that has been destroyed."""


# (case id, operation on (mr, ptr, size), expected exception, words the message must contain)
ALLOC_CASES = [
    ("nbytes=-1", lambda mr, p, n: mr.allocate(-1, DEFAULT_STREAM), ValueError, "nbytes"),
    ("nbytes=float", lambda mr, p, n: mr.allocate(1.5, DEFAULT_STREAM), TypeError, "nbytes"),
    ("nbytes=str", lambda mr, p, n: mr.allocate("64", DEFAULT_STREAM), TypeError, "nbytes"),
    ("nbytes=bool", lambda mr, p, n: mr.allocate(True, DEFAULT_STREAM), TypeError, "nbytes"),
    ("nbytes=None", lambda mr, p, n: mr.allocate(None, DEFAULT_STREAM), TypeError, "nbytes"),
    ("nbytes=np.float64", lambda mr, p, n: mr.allocate(np.float64(64), DEFAULT_STREAM), TypeError, "nbytes"),
    ("alignment=3", lambda mr, p, n: mr.allocate(64, DEFAULT_STREAM, 3), ValueError, "alignment"),
    ("alignment=0", lambda mr, p, n: mr.allocate(64, DEFAULT_STREAM, 0), ValueError, "alignment"),
    ("alignment=float", lambda mr, p, n: mr.allocate(64, DEFAULT_STREAM, 256.0), TypeError, "alignment"),
    ("stream=None", lambda mr, p, n: mr.allocate(64, None), TypeError, "stream"),
    ("stream=-1", lambda mr, p, n: mr.allocate(64, -1), ValueError, "stream"),
    ("stream=str", lambda mr, p, n: mr.allocate(64, "default"), TypeError, "stream"),
    ("nbytes=2**70", lambda mr, p, n: mr.allocate(2 ** 70, DEFAULT_STREAM), OutOfMemoryError, "bytes"),
    # a forgotten argument is named, in the resource's own public terms (no private method's name)
    ("stream missing", lambda mr, p, n: mr.allocate(64), TypeError, "'stream'"),
    ("nothing given", lambda mr, p, n: mr.allocate(), TypeError, "'nbytes'"),
]
FREE_CASES = [
    ("ptr=unknown", lambda mr, p, n: mr.deallocate(p + 1 << 40, n, DEFAULT_STREAM), ValueError, "ptr"),
    ("nbytes=wrong", lambda mr, p, n: mr.deallocate(p, n + 1, DEFAULT_STREAM), ValueError, "nbytes"),
    ("nbytes=float", lambda mr, p, n: mr.deallocate(p, float(n), DEFAULT_STREAM), TypeError, "nbytes"),
    ("stream=None", lambda mr, p, n: mr.deallocate(p, n, None), TypeError, "stream"),
    ("free stream missing", lambda mr, p, n: mr.deallocate(p, n), TypeError, "'stream'"),
    ("free nbytes missing", lambda mr, p, n: mr.deallocate(p), TypeError, "'nbytes'"),
    # the live pointer as a float equal to it: a dict look-up finds the block, so only a type check refuses it
    ("ptr=float(live)", lambda mr, p, n: mr.deallocate(float(p), n, DEFAULT_STREAM), TypeError, "ptr"),
    ("free alignment=3", lambda mr, p, n: mr.deallocate(p, n, DEFAULT_STREAM, 3), ValueError, "alignment"),
    ("free alignment=float", lambda mr, p, n: mr.deallocate(p, n, DEFAULT_STREAM, 256.0), TypeError, "alignment"),
]
CASES = [(r, cid, op, exc, word) for r in RESOURCES for cid, op, exc, word in ALLOC_CASES + FREE_CASES]


@pytest.mark.parametrize("resource,case,op,exc,word", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input_on_every_resource(resource, case, op, exc, word):
    set_backend(SimDriver(policy="eager"))
    mr = RESOURCES[resource]()
    n = 3000
    p = mr.allocate(n, DEFAULT_STREAM)  # one live block, so frees have something to get wrong
    before = _state(mr)
    with pytest.raises(exc) as info:
        op(mr, p, n)
    assert word in str(info.value), f"the message does not name {word!r}: {info.value}"
    assert "._" not in str(info.value), f"the message names a private method: {info.value}"
    if exc is OutOfMemoryError:
        assert repr(mr).split("(")[0] in str(info.value) or "resource" in str(info.value).lower() \
            or "limit" in str(info.value)
    after = _state(mr)
    if exc is OutOfMemoryError and isinstance(mr, LoggingAdaptor):  # a failure is an event, as in RMM
        assert after["log"].startswith(before["log"]) and after["log"].count("allocate failure") == 1
        after["log"] = before["log"]
    assert after == before
    mr.deallocate(p, n, DEFAULT_STREAM)  # the block is still the caller's and frees normally
    assert (getattr(mr, "live_bytes", 0) or 0) == 0


@pytest.mark.parametrize("resource", list(RESOURCES))
def test_a_live_pointer_as_a_numpy_integer_frees_on_every_resource(resource):
    """The pointer given back as a NumPy integer (read from an array of pointers) frees the block; every
    later pointer is an ``int``, tables of live blocks hold ints, and a log records the free as any
    other."""
    set_backend(SimDriver(policy="eager"))
    mr = RESOURCES[resource]()
    n = 3000
    for _ in range(4):  # the size becomes hot where the resource caches
        mr.deallocate(mr.allocate(n, DEFAULT_STREAM), n, DEFAULT_STREAM)
    p = mr.allocate(np.int64(n), DEFAULT_STREAM)  # the size from an array too
    outstanding = getattr(mr, "outstanding", None)
    if callable(outstanding):
        assert [(type(q), type(m)) for q, m in outstanding().items()] == [(int, int)]
    mr.deallocate(np.uint64(p), np.int64(n), DEFAULT_STREAM)
    assert (getattr(mr, "live_bytes", 0) or 0) == 0
    again = [mr.allocate(n, DEFAULT_STREAM) for _ in range(3)]
    assert all(type(q) is int for q in again)
    for q in again:
        mr.deallocate(q, n, DEFAULT_STREAM)
    if isinstance(mr, LoggingAdaptor):
        mr.flush()
        frees = [ln for ln in mr._file.getvalue().splitlines() if ",free," in ln]
        assert len(frees) == 8 and f",free,{p:#x},{n}," in frees[4]
    assert (getattr(mr, "live_bytes", 0) or 0) == 0


@pytest.mark.parametrize("resource", list(RESOURCES))
def test_a_block_freed_on_a_stream_closed_meanwhile_goes_back_on_every_resource(resource):
    """The stream a block was allocated and used on is closed before the free that names it (a
    CuPy or PyTorch stream collected meanwhile is the same case): the free waits for the device
    instead of the stream, and the block goes back; the next blocks are usable."""
    set_backend(drv := SimDriver(policy="eager"))
    mr = RESOURCES[resource]()
    s = Stream.create(driver=drv)
    p = mr.allocate(3000, s)
    s.close()
    mr.deallocate(p, 3000, s)
    assert (getattr(mr, "live_bytes", 0) or 0) == 0
    q = mr.allocate(3000, DEFAULT_STREAM)
    mr.deallocate(q, 3000, DEFAULT_STREAM)
    assert (getattr(mr, "live_bytes", 0) or 0) == 0


# -- entry points other than allocate/deallocate -----------------------------------------------------
OTHER = [
    ("parse_size(-1)", lambda: mrkit.parse_size(-1, "limit"), ValueError, "limit"),
    ("parse_size('lots')", lambda: mrkit.parse_size("lots", "limit"), ValueError, "limit"),
    ("parse_size(None)", lambda: mrkit.parse_size(None, "limit"), TypeError, "limit"),
    ("parse_spec(5)", lambda: mrkit.parse_spec(5), TypeError, "spec"),
    ("parse_spec('')", lambda: mrkit.parse_spec(""), ValueError, "resource spec"),
    ("parse_spec('pool(')", lambda: mrkit.parse_spec("pool("), ValueError, "position"),
    ("parse_spec('limiting(device, 0)')", lambda: mrkit.parse_spec("limiting(device, 0)"), ValueError, "limit"),
    ("PoolResource(upstream=1)", lambda: PoolResource(1), TypeError, "upstream"),
    ("PoolResource(initial_size=-1)", lambda: PoolResource(CudaMemoryResource(0), -1), ValueError, "initial_size"),
    ("PoolResource(maximum < initial)", lambda: PoolResource(CudaMemoryResource(0), "8 MiB", "4 MiB"),
     ValueError, "maximum_size"),
    ("BinningResource(max_bin=100)", lambda: BinningResource(CudaMemoryResource(0), 100), ValueError, "max_bin"),
    ("LimitingAdaptor(limit='x')", lambda: LimitingAdaptor(CudaMemoryResource(0), "x"), ValueError, "limit"),
    ("LoggingAdaptor(sink=5)", lambda: LoggingAdaptor(CudaMemoryResource(0), 5), TypeError, "sink"),
    ("LoggingAdaptor(buffer_lines=0)", lambda: LoggingAdaptor(CudaMemoryResource(0), io.StringIO(), buffer_lines=0),
     ValueError, "buffer_lines"),
    ("DeviceMemoryResource(device=99)", lambda: DeviceMemoryResource(99), mrkit.CUDAError, "device"),
    ("set_current_resource(5)", lambda: mrkit.set_current_resource(5), TypeError, "mr"),
    ("get_current_resource(-1)", lambda: mrkit.get_current_resource(-1), ValueError, "device"),
    ("Stream.wrap('x')", lambda: Stream.wrap("x"), TypeError, "handle"),
    ("read_log(binary)", lambda: mrkit.read_log(io.BytesIO(b"\xff\xfe")), ValueError, "not an allocation log"),
    ("read_log(no header)", lambda: mrkit.read_log("a,b\n1,2\n"), ValueError, "header"),
    ("read_log(bad action)", lambda: mrkit.read_log("Thread,Time,Action,Pointer,Size,Stream\n1,0,steal,0x1,1,0\n"),
     ValueError, "line 2"),
    ("read_log(5)", lambda: mrkit.read_log(5), TypeError, "source"),
    ("allocate_buffer(nbytes=-1)", lambda: HostMemoryResource().allocate_buffer(-1), ValueError,
     "nbytes"),
]


@pytest.mark.parametrize("case,op,exc,word", OTHER, ids=[c[0] for c in OTHER])
def test_bad_input_on_other_entry_points(sim, case, op, exc, word):
    with pytest.raises(exc) as info:
        op()
    assert word in str(info.value), f"the message does not name {word!r}: {info.value}"
    assert "._" not in str(info.value), f"the message names a private method: {info.value}"


def test_the_table_is_big_enough():
    assert len(CASES) + len(OTHER) >= 100
