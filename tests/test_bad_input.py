"""Bad input never loses memory or lets a limit through (issue: nothing lost, nothing bypassed)."""
from __future__ import annotations

import numpy as np
import pytest

from mrkit import (
    DEFAULT_STREAM, BinningResource, CudaMemoryResource, DeviceMemoryResource, HostMemoryResource,
    LimitingAdaptor, OutOfMemoryError, PoolResource, StatisticsAdaptor, TrackingAdaptor, VirtualMemoryResource,
)


def test_limiting_enforces_its_limit_for_numpy_sizes(sim):
    lim = LimitingAdaptor(CudaMemoryResource(), 4096)
    with pytest.raises(OutOfMemoryError, match="limit"):
        lim.allocate(np.int64(8192), DEFAULT_STREAM)
    p = lim.allocate(np.int64(4096), DEFAULT_STREAM)
    assert lim.used_bytes == 4096
    with pytest.raises(OutOfMemoryError):
        lim.allocate(np.int32(1), DEFAULT_STREAM)
    lim.deallocate(p, np.int64(4096), DEFAULT_STREAM)
    assert lim.used_bytes == 0 and type(lim.used_bytes) is int


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.int64])
@pytest.mark.parametrize("over_pool", [False, True])
def test_statistics_count_unsigned_numpy_sizes_exactly(sim, dtype, over_pool):
    up = CudaMemoryResource()
    stats = StatisticsAdaptor(PoolResource(up) if over_pool else up)
    p = stats.allocate(dtype(1000), DEFAULT_STREAM)
    stats.deallocate(p, dtype(1000), DEFAULT_STREAM)
    s = stats.statistics
    assert (s.current_count, s.total_count, s.current_bytes, s.total_bytes, s.peak_bytes) == (0, 1, 0, 1000, 1000)


@pytest.mark.parametrize("make", [lambda: PoolResource(CudaMemoryResource()), lambda: VirtualMemoryResource(0)])
@pytest.mark.parametrize("bad,exc", [(1000.0, TypeError), ("1000", TypeError), (True, TypeError), (-1000, ValueError)])
def test_a_bad_free_leaves_the_block_freeable(sim, make, bad, exc):
    mr = make()
    p = mr.allocate(1000, DEFAULT_STREAM)
    with pytest.raises(exc, match="nbytes"):
        mr.deallocate(p, bad, DEFAULT_STREAM)
    assert mr.live_bytes == 1000  # unchanged
    mr.deallocate(p, np.uint64(1000), DEFAULT_STREAM)  # the right free (numpy size) still works
    assert mr.live_bytes == 0
    with pytest.raises(ValueError, match="already freed"):
        mr.deallocate(p, 1000, DEFAULT_STREAM)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: PoolResource(CudaMemoryResource()), id="pool"),
    pytest.param(lambda: VirtualMemoryResource(0), id="vmm"),
    pytest.param(lambda: CudaMemoryResource(), id="cumemalloc"),
    pytest.param(lambda: DeviceMemoryResource(0), id="driver-pool"),
    pytest.param(lambda: HostMemoryResource(), id="host"),
    pytest.param(lambda: BinningResource(CudaMemoryResource()), id="binning"),
    pytest.param(lambda: TrackingAdaptor(CudaMemoryResource()), id="tracking"),
])
@pytest.mark.parametrize("ptr", ["0x1000", 4096.0, None, True], ids=["str", "float", "None", "bool"])
def test_a_free_of_a_pointer_that_is_not_an_int_names_the_argument(sim, make, ptr):
    """``deallocate("0x1000", ...)`` is a TypeError that names ``ptr`` (it used to fail formatting the
    pointer in the error message), and the resource's blocks are untouched."""
    mr = make()
    p = mr.allocate(4096, DEFAULT_STREAM)
    with pytest.raises(TypeError, match=r"^ptr must be an int, not " + type(ptr).__name__):
        mr.deallocate(ptr, 4096, DEFAULT_STREAM)
    mr.deallocate(p, 4096, DEFAULT_STREAM)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: PoolResource(CudaMemoryResource()), id="pool"),
    pytest.param(lambda: VirtualMemoryResource(0), id="vmm"),
    pytest.param(lambda: StatisticsAdaptor(PoolResource(CudaMemoryResource())), id="statistics(pool)"),
])
def test_a_live_pointer_given_as_a_float_or_a_numpy_int(sim, make):
    """The pointer of a live block given as a float equal to it is a TypeError naming ``ptr``, and the
    block stays live (a dict look-up found the float equal to the int and freed it, in the Python
    build); given as a NumPy integer it is freed, and the cache never hands the NumPy object out
    again: every pointer allocated is an ``int`` (both builds)."""
    mr = make()
    for _ in range(4):  # the size becomes hot: its frees go to the cache
        mr.deallocate(mr.allocate(4096, DEFAULT_STREAM), 4096, DEFAULT_STREAM)
    p = mr.allocate(4096, DEFAULT_STREAM)
    with pytest.raises(TypeError, match=r"^ptr must be an int, not float"):
        mr.deallocate(float(p), 4096, DEFAULT_STREAM)
    assert mr.live_bytes == 4096  # unchanged
    mr.deallocate(np.uint64(p), 4096, DEFAULT_STREAM)
    assert mr.live_bytes == 0
    again = [mr.allocate(4096, DEFAULT_STREAM) for _ in range(3)]
    assert p in again and all(type(q) is int for q in again)
    for q in again:
        mr.deallocate(q, 4096, DEFAULT_STREAM)
    assert mr.live_bytes == 0


def test_host_allocation_beyond_addressable_is_out_of_memory():
    mr = HostMemoryResource()
    with pytest.raises(OutOfMemoryError, match=str(2**64)):
        mr.allocate(2**64, DEFAULT_STREAM)


def test_a_log_survives_interpreter_exit_without_close(tmp_path):
    import subprocess
    import sys
    log = tmp_path / "events.csv"
    code = (
        "import mrkit\n"
        "mrkit.set_backend('sim')\n"
        f"mr = mrkit.LoggingAdaptor(mrkit.HostMemoryResource(), {str(log)!r})\n"
        "for _ in range(100):\n"
        "    p = mr.allocate(256, mrkit.DEFAULT_STREAM)\n"
        "    mr.deallocate(p, 256, mrkit.DEFAULT_STREAM)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    from mrkit import read_log
    assert len(read_log(str(log))) == 200


def test_a_failed_free_is_not_logged_and_a_free_is_logged_before_reuse(sim):
    import io
    from mrkit import LoggingAdaptor, read_log
    sink = io.StringIO()
    mr = LoggingAdaptor(PoolResource(CudaMemoryResource()), sink)
    p = mr.allocate(512, DEFAULT_STREAM)
    with pytest.raises(ValueError):
        mr.deallocate(p, 1024, DEFAULT_STREAM)  # wrong size: refused, not logged
    mr.deallocate(p, 512, DEFAULT_STREAM)
    mr.flush()
    sink.seek(0)
    assert [e.action for e in read_log(sink)] == ["allocate", "free"]


def test_read_log_of_a_binary_file_is_a_value_error(tmp_path):
    from mrkit import read_log
    f = tmp_path / "bin.csv"
    f.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match="source .* not an allocation log"):
        read_log(str(f))


# -- logs that survive ---------------------------------------------------------------------------
_KILLED_WRITER = r"""
import os, sys, time
import mrkit
from mrkit import DEFAULT_STREAM, HostMemoryResource, LoggingAdaptor
log = LoggingAdaptor(HostMemoryResource(), sys.argv[1], buffer_lines=int(sys.argv[2]),
                     flush_interval=None if sys.argv[3] == "none" else float(sys.argv[3]))
for i in range(int(sys.argv[4])):
    p = log.allocate(64 + i, DEFAULT_STREAM)
    log.deallocate(p, 64 + i, DEFAULT_STREAM)
print("ready", flush=True)
time.sleep(60)
"""


def _kill_after_ready(tmp_path, buffer_lines, interval, pairs, wait):
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "killed.csv"
    with subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path), str(buffer_lines), interval,
                           str(pairs)], stdout=subprocess.PIPE, text=True) as p:
        try:
            assert p.stdout.readline().strip() == "ready"
            time.sleep(wait)
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
    assert p.returncode == -signal.SIGKILL
    from mrkit import read_log
    return read_log(path) if path.stat().st_size else []


def test_sigkill_loses_nothing_older_than_the_flush_interval(tmp_path):
    events = _kill_after_ready(tmp_path, buffer_lines=10**6, interval="0.1", pairs=100, wait=1.0)
    assert len(events) == 200  # the count bound was never reached: the timer wrote them all


def test_sigkill_loses_at_most_the_buffered_event_count(tmp_path):
    events = _kill_after_ready(tmp_path, buffer_lines=50, interval="none", pairs=115, wait=0.0)
    assert 230 - 50 < len(events) <= 230 and len(events) % 50 == 0


def test_many_writer_threads_lose_no_event_and_keep_frees_before_reuse(tmp_path, sim):
    import threading

    from mrkit import LoggingAdaptor, Stream, read_log, replay
    path = tmp_path / "threads.csv"
    log = LoggingAdaptor(PoolResource(CudaMemoryResource()), path, buffer_lines=97)
    streams = [Stream.create() for _ in range(8)]

    def work(s):
        for i in range(300):
            p = log.allocate(256 * (1 + i % 7), s)
            log.deallocate(p, 256 * (1 + i % 7), s)

    ts = [threading.Thread(target=work, args=(s,)) for s in streams]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    log.close()
    events = read_log(path)
    assert len(events) == 8 * 300 * 2
    r = replay(events, PoolResource(CudaMemoryResource()))  # the replay's own consistency check passes
    assert r.events == len(events)


def test_logging_options_are_validated():
    from mrkit import LoggingAdaptor
    import io
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="buffer_lines"):
            LoggingAdaptor(HostMemoryResource(), io.StringIO(), buffer_lines=bad)
    for bad in (0, -1.0, float("inf"), "1"):
        with pytest.raises(ValueError, match="flush_interval"):
            LoggingAdaptor(HostMemoryResource(), io.StringIO(), flush_interval=bad)


# -- replay of logs that contradict themselves -------------------------------------------------------
_HDR = "Thread,Time,Action,Pointer,Size,Stream\n"


@pytest.mark.parametrize("body,match", [
    ("1,0.1,allocate,0x1000,64,0x0\n1,0.2,free,0x1000,32,0x0\n", "freed with size 32"),
    ("1,0.1,allocate,0x1000,64,0x0\n1,0.2,allocate,0x1000,64,0x0\n", "allocated again"),
])
def test_replay_refuses_an_inconsistent_log_before_allocating(sim, body, match):
    from mrkit import replay
    mr = PoolResource(CudaMemoryResource())
    with pytest.raises(ValueError, match=match):
        replay(_HDR + body, mr)
    assert mr.live_bytes == 0 and mr.pool_size == 0  # nothing was allocated


def test_replay_frees_what_it_allocated_when_the_resource_fails(sim):
    from mrkit import replay
    mr = PoolResource(CudaMemoryResource())
    calls = []
    real = mr.allocate

    class Boom(RuntimeError):
        pass

    class Failing:  # a resource whose third allocation raises something other than OOM
        device_id, device_accessible, driver = 0, True, None

        def allocate(self, n, s, alignment=256):
            calls.append(n)
            if len(calls) == 3:
                raise Boom("driver fell over")
            return real(n, s)

        def deallocate(self, p, n, s, alignment=256):
            mr.deallocate(p, n, s)

    body = "".join(f"1,0.{i},allocate,{0x1000 * (i + 1):#x},64,0x0\n" for i in range(5))
    with pytest.raises(Boom):
        replay(_HDR + body, Failing())
    assert mr.live_bytes == 0  # the two allocations made before the failure were freed


# -- specs and MRKIT_RESOURCE -----------------------------------------------------------------------
@pytest.mark.parametrize("spec,match", [
    ("limiting(pool(device), 0)", "limit must be positive"),
    ("limiting(pool(device))", "needs limit"),
    ("logging(device, 5)", "path must be a non-empty quoted string"),
    ("statistics(1)", "upstream must be a resource"),
    ("pool(device, bogus=1)", "no argument 'bogus'"),
    ("fancy(device)", "unknown resource 'fancy'"),
    ("device(1.5)", "device ordinal"),
    ("limiting(pool(device), -1)", "unexpected character '-'"),
])
def test_semantic_spec_errors_are_reported_when_the_spec_is_read(spec, match):
    from mrkit import parse_spec
    with pytest.raises(ValueError, match=match):
        parse_spec(spec)


def test_a_bad_mrkit_resource_fails_at_first_use_naming_the_variable():
    import os
    import subprocess
    import sys
    env = dict(os.environ, MRKIT_RESOURCE="limiting(pool(device), 0)", MRKIT_BACKEND="sim")
    r = subprocess.run([sys.executable, "-c", "import mrkit"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr  # import never reads it (`mrkit --help` must work)
    r = subprocess.run([sys.executable, "-c", "import mrkit; mrkit.get_current_resource()"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "MRKIT_RESOURCE='limiting(pool(device), 0)' is not a valid resource spec" in r.stderr
    assert "limit must be positive" in r.stderr


def test_mrkit_resource_applies_per_device_and_each_device_keeps_its_own_log(tmp_path, monkeypatch):
    import mrkit
    from mrkit import LoggingAdaptor, get_current_resource, read_log
    from mrkit.driver import SimDriver, set_backend
    set_backend(SimDriver(2))
    monkeypatch.setenv("MRKIT_RESOURCE", f'logging(pool(device), "{tmp_path}/log.csv", buffer_lines=1)')
    mr0 = get_current_resource(0)
    p = mr0.allocate(1000, DEFAULT_STREAM)
    mr1 = get_current_resource(1)  # built after device 0 logged: must not truncate its file
    q = mr1.allocate(2000, DEFAULT_STREAM)
    assert isinstance(mr0, LoggingAdaptor) and mr0.upstream.device_id == 0 and mr1.upstream.device_id == 1
    mr0.deallocate(p, 1000, DEFAULT_STREAM)
    mr1.deallocate(q, 2000, DEFAULT_STREAM)
    mr0.close()
    mr1.close()
    assert [e.size for e in read_log(tmp_path / "log.csv")] == [1000, 1000]
    assert [e.size for e in read_log(tmp_path / "log.device1.csv")] == [2000, 2000]
    monkeypatch.setenv("MRKIT_RESOURCE", "statistics(pool(device(1)))")  # names device 1 only
    mrkit._current._reset_current_resources()
    assert isinstance(get_current_resource(1), mrkit.StatisticsAdaptor)
    assert not isinstance(get_current_resource(0), mrkit.StatisticsAdaptor)


# -- the command line ---------------------------------------------------------------------------------
def _cli(*argv):
    import subprocess
    import sys
    import os
    env = dict(os.environ, MRKIT_BACKEND="sim")
    return subprocess.run([sys.executable, "-m", "mrkit", *argv], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("argv,code,match", [
    (("demo", "--ops", "0"), 2, "argument --ops: must be at least 1, got 0"),
    (("demo", "--ops", "many"), 2, "expected a whole number"),
    (("nonsense",), 2, "invalid choice"),
    (("replay", "/nonexistent/log.csv"), 1, "No such file"),
    (("replay", "__BINARY__"), 1, "not an allocation log"),
    (("replay", "__LOG__", "--resource", "pool(device, 0)x"), 2, "resource spec"),
])
def test_cli_errors_are_one_line_with_exit_codes(tmp_path, argv, code, match):
    binary = tmp_path / "b.bin"
    binary.write_bytes(bytes(range(256)))
    log = tmp_path / "l.csv"
    log.write_text(_HDR + "1,0.1,allocate,0x1000,64,0x0\n")
    argv = [str(binary) if a == "__BINARY__" else str(log) if a == "__LOG__" else a for a in argv]
    r = _cli(*argv)
    assert r.returncode == code, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("mrkit") and "error:" in last and match in last
    assert "Traceback" not in r.stderr


def test_cli_debug_shows_the_traceback(tmp_path):
    r = _cli("--debug", "replay", str(tmp_path / "missing.csv"))
    assert r.returncode == 1 and "Traceback" in r.stderr and "FileNotFoundError" in r.stderr


def test_demo_sizes_its_workload_to_the_device():
    from mrkit._cli import demo_workload
    from mrkit.driver import SimDeviceSpec, SimDriver
    for total in (64 << 20, 1 << 30):
        drv = SimDriver([SimDeviceSpec(total_memory=total)])
        plan = demo_workload(drv, 25000)
        live, sizes, peak = {}, [], 0
        for i, (kind, a, _) in enumerate(plan):
            if kind == "a":
                live[i] = a
            else:
                del live[a]
            peak = max(peak, sum(live.values()))
        assert len(plan) == 25000 and peak <= total // 4


def test_demo_with_25000_operations_finishes_on_the_simulator(capsys):
    from mrkit._cli import main
    assert main(["demo", "--backend", "sim", "--ops", "25000", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "bytes lost" in out and "25000 on 4 streams" in out


# -- fuzzing: garbage in, a clear ValueError out -------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SPEC_ALPHABET = st.sampled_from(list("()=,'\" .-_0123456789") + ["pool", "device", "limiting", "logging", "GiB",
                                                                    "statistics", "binning", "host", "KiB", "x"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(_SPEC_ALPHABET, max_size=14).map("".join)))
def test_fuzzed_specs_parse_or_raise_value_error(text):
    from mrkit import parse_spec
    try:
        parse_spec(text)
    except ValueError as exc:
        assert "resource spec" in str(exc)


_LOG_LINE = st.lists(st.one_of(st.sampled_from(["allocate", "free", "deallocate", "allocate failure", "0x10", "-5",
                                                "1e999", "12:00:01.5", "2026-13-01", "0xzz", ""]),
                               st.text(max_size=6), st.integers(-10, 10**20).map(str)), max_size=7).map(",".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=80),
                 st.lists(_LOG_LINE, max_size=5).map(lambda ls: "Thread,Time,Action,Pointer,Size,Stream\n" + "\n".join(ls)),
                 st.text(max_size=80)))
def test_fuzzed_logs_read_or_raise_value_error(data):
    import io
    from mrkit import HostMemoryResource, read_log, replay
    src = io.BytesIO(data) if isinstance(data, bytes) else data + ("\n" if "\n" not in data else "")
    try:
        events = read_log(src)
    except ValueError:
        return
    try:
        replay(events, HostMemoryResource())
    except ValueError as exc:
        assert "log event" in str(exc)


def test_cli_info_json_says_which_backend_and_why(capsys):
    import json
    from mrkit._cli import main
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] in ("sim", "cuda") and data["reason"]
    assert data["devices"] and data["devices"][0]["total_bytes"] > 0
    if data["backend"] == "sim":
        assert "no NVIDIA driver" in data["reason"] or "MRKIT_BACKEND=sim" in data["reason"]


def test_cli_snapshot_of_a_log(tmp_path, capsys):
    import pickle
    from mrkit._cli import main
    log = tmp_path / "l.csv"
    log.write_text(_HDR + "1,0.1,allocate,0x1000,64,0x0\n1,0.2,free,0x1000,64,0x0\n")
    assert main(["snapshot", str(log), "-o", str(tmp_path / "s.pickle")]) == 0
    snap = pickle.loads((tmp_path / "s.pickle").read_bytes())
    assert [e["action"] for e in snap["device_traces"][0]] == ["alloc", "free_requested", "free_completed"]
    assert "3 trace events" in capsys.readouterr().out


def test_a_free_on_a_collected_foreign_stream_waits_and_uses_the_default_stream(sim):
    # CuPy's test suite with mrkit installed: a CuPy stream was collected (destroyed) before the arrays
    # allocated on it; their frees went to the dead handle (a segfault inside the driver on the GPU)
    import gc
    from mrkit import DeviceMemoryResource, Stream
    from mrkit._stream import as_stream

    class Foreign:  # a library's stream object (CuPy's, PyTorch's): mrkit's view lives while it does
        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            return (0, self.handle)

    mr = DeviceMemoryResource()
    raw = Stream.create()
    obj = Foreign(raw.handle)
    s = as_stream(obj)
    p = mr.allocate(4096, s)
    sim.memset_async(p, 1, 4096, s.handle)  # work still queued on the stream when it goes away
    del obj
    gc.collect()
    raw.close()
    assert s.alive is False
    mr.deallocate(p, 4096, s)
    assert mr.live_bytes == 0
    sim.ctx_synchronize(0)


def test_a_negative_handle_from_cuda_stream_is_a_value_error_naming_the_stream(sim):
    """``__cuda_stream__`` returning a negative handle reached the driver (``CUDAError`` from
    ``cuStreamGetId``); it is refused as a raw negative handle is, naming the method, state unchanged."""
    from mrkit import DeviceMemoryResource, PoolResource

    class Neg:
        def __cuda_stream__(self):
            return (0, -3)

    pool = PoolResource(DeviceMemoryResource(0))
    with pytest.raises(ValueError, match=r"stream handle must be >= 0, got -3 from Neg.__cuda_stream__\(\)"):
        pool.allocate(256, Neg())
    assert pool.live_bytes == 0 and pool.pool_size == 0
