"""A new user's first hour (issue 35): the library falls back to the simulator like the command line,
``reinitialize`` is atomic, adaptors refuse what they cannot honour, the command line's flags and
environment variables are checked before any work, and RMM's and CuPy's habits get a hint or work."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

import mrkit
from mrkit import (DEFAULT_STREAM, BinningResource, DeviceMemoryResource, LimitingAdaptor, LoggingAdaptor,
                   PoolResource, StatisticsAdaptor, TrackingAdaptor, VirtualMemoryResource)
from mrkit.driver import SimDriver, get_driver, reset_backend, set_backend

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MRKIT_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + sys.path)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=HERE)


def _cli(*argv, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MRKIT_")}
    env.setdefault("MRKIT_BACKEND", "sim")
    env.update(env_extra)
    env = {k: v for k, v in env.items() if v is not None}
    env["PYTHONPATH"] = os.pathsep.join([HERE] + sys.path)
    return subprocess.run([sys.executable, "-m", "mrkit", *argv], capture_output=True, text=True, env=env, cwd=HERE)


def _no_gpu() -> bool:
    from mrkit.driver import CudaDriver
    try:
        return CudaDriver().device_count() == 0
    except mrkit.CUDAUnavailableError:
        return True


# -- 1. the library falls back to the simulator where the command line does --------------------------
@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU: nothing to fall back from")
def test_a_plain_program_runs_on_the_simulator_without_a_gpu_and_says_so_once():
    r = _run("import warnings, mrkit\n"
             "with warnings.catch_warnings(record=True) as w:\n"
             "    warnings.simplefilter('always')\n"
             "    mr = mrkit.PoolResource(mrkit.DeviceMemoryResource())\n"
             "    p = mr.allocate(1000, mrkit.DEFAULT_STREAM)\n"
             "    mr.deallocate(p, 1000, mrkit.DEFAULT_STREAM)\n"
             "    mrkit.get_current_resource()\n"
             "print(mrkit.get_driver().name, len(w), w[0].category.__name__)\n"
             "print(w[0].message)")
    assert r.returncode == 0, r.stderr
    first, msg = r.stdout.splitlines()[:2]
    assert first == "sim 1 SimulatorFallbackWarning"
    assert "simulat" in msg and "MRKIT_BACKEND=cuda" in msg


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU")
def test_mrkit_backend_cuda_set_explicitly_still_refuses_without_a_gpu():
    r = _run("import mrkit; mrkit.DeviceMemoryResource()", MRKIT_BACKEND="cuda")
    assert r.returncode != 0 and "CUDAUnavailableError" in r.stderr


def test_a_bad_mrkit_backend_names_the_variable(monkeypatch):
    monkeypatch.setenv("MRKIT_BACKEND", "gpu")
    reset_backend()
    with pytest.raises(ValueError, match=r"MRKIT_BACKEND='gpu'.*'cuda' or 'sim'"):
        get_driver()


# -- 2. reinitialize is atomic ----------------------------------------------------------------------
def _missing(mod: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(mod) is None


@pytest.mark.parametrize("flag,module", [("cupy", "cupy"), ("numba", "numba")])
def test_reinitialize_with_a_missing_package_changes_nothing(sim, flag, module):
    if not _missing(module):
        pytest.skip(f"{module} is installed here")
    before = mrkit.get_current_resource(0)
    with pytest.raises(ModuleNotFoundError, match=rf"{flag}=True needs {module}.*pip install"):
        mrkit.reinitialize("pool", **{flag: True})
    assert mrkit.get_current_resource(0) is before


# -- 3, 4, 8. adaptors and resources refuse what they cannot honour -----------------------------------
def test_statistics_never_counts_a_free_of_memory_it_did_not_count(sim):
    pool = PoolResource(DeviceMemoryResource())
    for mr in (StatisticsAdaptor(pool), StatisticsAdaptor(DeviceMemoryResource())):
        up = mr.upstream
        p = up.allocate(4096, DEFAULT_STREAM)  # not through the adaptor
        mr.deallocate(p, 4096, DEFAULT_STREAM)  # the memory goes home ...
        q = mr.allocate(4096, DEFAULT_STREAM)
        s = mr.statistics
        assert (s.current_bytes, s.current_count, s.total_bytes) == (4096, 1, 4096)  # ... uncounted
        mr.deallocate(q, 4096, DEFAULT_STREAM)
        assert mr.statistics.current_bytes == 0 and mr.statistics.peak_bytes == 4096


def test_a_closed_log_refuses_to_serve(sim, tmp_path):
    log = LoggingAdaptor(PoolResource(DeviceMemoryResource()), tmp_path / "log.csv")
    p = log.allocate(512, DEFAULT_STREAM)
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.allocate(512, DEFAULT_STREAM)
    with pytest.raises(ValueError, match="closed"):
        log.deallocate(p, 512, DEFAULT_STREAM)
    assert [e.action for e in mrkit.read_log(tmp_path / "log.csv")] == ["allocate"]
    log.upstream.deallocate(p, 512, DEFAULT_STREAM)


def test_limiting_refuses_a_limit_of_zero(sim):
    with pytest.raises(ValueError, match="limit must be positive"):
        LimitingAdaptor(PoolResource(DeviceMemoryResource()), 0)


def test_an_adaptors_missing_attribute_names_the_adaptor(sim):
    mr = StatisticsAdaptor(TrackingAdaptor(PoolResource(DeviceMemoryResource())))
    with pytest.raises(AttributeError, match=r"'StatisticsAdaptor' object has no attribute 'bogus'") as e:
        mr.bogus
    assert "PoolResource" in str(e.value)  # and says what it looked through
    assert mr.pool_size == 0  # helpers of the stack stay reachable


@pytest.mark.parametrize("cls", [DeviceMemoryResource, VirtualMemoryResource, mrkit.CudaMemoryResource,
                                 mrkit.ManagedMemoryResource])
def test_a_device_of_the_wrong_type_is_a_type_error(sim, cls):
    with pytest.raises(TypeError, match="device must be an int"):
        cls("0")
    with pytest.raises(ValueError, match="device"):
        cls(-1)


@pytest.mark.parametrize("make", [
    lambda: PoolResource(DeviceMemoryResource()),
    lambda: VirtualMemoryResource(),
    lambda: BinningResource(DeviceMemoryResource()),
    lambda: DeviceMemoryResource(),
    lambda: mrkit.CudaMemoryResource(),
])
def test_a_free_with_the_wrong_alignment_is_refused_and_changes_nothing(sim, make):
    mr = make()
    big = min(4096, mr.max_alignment)
    p = mr.allocate(1000, DEFAULT_STREAM, big)
    q = mr.allocate(1000, DEFAULT_STREAM)
    if big > 256:
        with pytest.raises(ValueError, match="alignment"):
            mr.deallocate(p, 1000, DEFAULT_STREAM)
    with pytest.raises(ValueError, match="alignment"):
        mr.deallocate(q, 1000, DEFAULT_STREAM, 2 * mr.max_alignment if mr.max_alignment < 1 << 20 else 8192)
    mr.deallocate(p, 1000, DEFAULT_STREAM, big)  # the right free still works: nothing changed
    mr.deallocate(q, 1000, DEFAULT_STREAM)
    if hasattr(mr, "release"):
        mr.release()


def test_replay_takes_a_spec_string(sim, tmp_path):
    log = LoggingAdaptor(PoolResource(DeviceMemoryResource()), tmp_path / "log.csv")
    p = log.allocate(1000, DEFAULT_STREAM)
    log.deallocate(p, 1000, DEFAULT_STREAM)
    log.close()
    r = mrkit.replay(mrkit.read_log(tmp_path / "log.csv"), "statistics(pool(device))")
    assert r.events == 2 and r.failures == 0
    with pytest.raises(TypeError, match="resource must be a MemoryResource or a resource spec"):
        mrkit.replay(mrkit.read_log(tmp_path / "log.csv"), 42)


# -- 5, 6. the command line --------------------------------------------------------------------------
def test_replay_json_is_pure_json(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x1000,256,0x0\n1,0.2,free,0x1000,256,0x0\n")
    r = _cli("replay", str(log), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [x["resource"] for x in data["results"]] == ["device", "pool(device)"]


def test_json_stays_pure_with_a_progress_bar(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x1000,256,0x0\n1,0.2,free,0x1000,256,0x0\n")
    r = _cli("replay", str(log), "--json", "--progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"] and "replay" in r.stderr  # the bar went to stderr


def test_shared_flags_are_valid_after_the_subcommand():
    r = _cli("replay", "/nonexistent.csv", "--debug")
    assert "unrecognized arguments" not in r.stderr
    assert "Traceback" in r.stderr  # --debug shows it
    r = _cli("--debug", "replay", "/nonexistent.csv")
    assert "Traceback" in r.stderr


@pytest.mark.parametrize("argv,match", [
    (("demo", "--progress", "--quiet"), "not allowed with"),
    (("demo", "--plot", "x.png", "--no-plot"), "not allowed with"),
    (("demo", "--plot", "x.jpg"), "--plot: unsupported extension '.jpg'"),
    (("demo", "--plot", "/nonexistent/dir/x.png"), "--plot: the folder /nonexistent/dir does not exist"),
    (("replay", "__LOG__", "--resource", "pool(device"), "--resource"),
])
def test_conflicting_and_bad_flags_are_refused_before_any_work(tmp_path, argv, match):
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n")
    argv = [str(log) if a == "__LOG__" else a for a in argv]
    r = _cli(*argv, "--ops", "100000000") if argv[0] == "demo" else _cli(*argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert match in r.stderr
    assert r.stdout == ""  # no work started


def test_progress_without_rich_still_shows_progress(monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def no_rich(name, *a, **k):
        if name.startswith("rich"):
            raise ImportError("no rich here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_rich)
    from mrkit._ui import progress
    bar, advance = progress(100, "work", quiet=False)
    with bar:
        for _ in range(100):
            advance(1)
    err = capsys.readouterr().err
    assert "work" in err and "100/100" in err


def test_a_bad_mrkit_resource_leaves_help_working_and_fails_commands_in_one_line():
    r = _cli("--help", MRKIT_RESOURCE="pool(device")
    assert r.returncode == 0 and "usage: mrkit" in r.stdout
    r = _cli("info", MRKIT_RESOURCE="pool(device")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("mrkit: error: MRKIT_RESOURCE='pool(device' is not a valid resource spec")


def test_a_bad_mrkit_backend_fails_commands_naming_the_variable():
    r = _cli("info", MRKIT_BACKEND="gpu")
    assert r.returncode == 2 and "MRKIT_BACKEND='gpu'" in r.stderr and "Traceback" not in r.stderr


def test_mrkit_resource_naming_a_missing_device_is_refused(sim):
    os.environ["MRKIT_RESOURCE"] = "pool(device(3))"
    try:
        with pytest.raises(ValueError, match=r"MRKIT_RESOURCE='pool\(device\(3\)\)' names device 3.*has 1"):
            mrkit.get_current_resource(0)
        r = _cli("demo", "--ops", "10", MRKIT_RESOURCE="pool(device(3))")
        assert r.returncode == 2 and "names device 3" in r.stderr
    finally:
        del os.environ["MRKIT_RESOURCE"]


# -- 7. documented snippets -------------------------------------------------------------------------
def test_dump_snapshot_works_on_the_default_resource(sim, tmp_path):
    out = tmp_path / "snap.pickle"
    mrkit.dump_snapshot(str(out))
    assert out.stat().st_size > 0


# -- 9. RMM and CuPy habits -------------------------------------------------------------------------
def test_rmm_names_are_aliases_or_hints(sim, tmp_path):
    pool = PoolResource(DeviceMemoryResource(), initial_pool_size="1 MiB", maximum_pool_size="8 MiB")
    assert pool.pool_size == 1 << 20 and pool.maximum_size == 8 << 20
    with pytest.raises(ValueError, match="initial_pool_size: cannot parse size 'abc'"):
        PoolResource(DeviceMemoryResource(), initial_pool_size="abc")
    with pytest.raises(ValueError, match="initial_pool_size 2097152 exceeds maximum_pool_size 1048576"):
        PoolResource(DeviceMemoryResource(), initial_pool_size="2 MiB", maximum_pool_size="1 MiB")
    with pytest.raises(TypeError, match=r"give initial_size or initial_pool_size \(RMM's name\), not both"):
        PoolResource(DeviceMemoryResource(), 0, initial_pool_size=0)
    old = mrkit.get_current_resource(0)
    assert mrkit.set_current_device_resource(pool) is old
    assert mrkit.get_current_device_resource() is pool
    with pytest.raises(AttributeError, match=r"mrkit has no 'get_per_device_resource'.*get_current_resource"):
        mrkit.get_per_device_resource
    built = mrkit.reinitialize(pool_allocator=True, logging=True, log_file_name=str(tmp_path / "m.csv"),
                               devices=[0])
    assert isinstance(built[0], LoggingAdaptor) and isinstance(built[0].upstream, PoolResource)
    mrkit.reinitialize()  # closes the log
    b = BinningResource(DeviceMemoryResource(), min_size_exponent=10, max_size_exponent=16)
    assert b.max_bin == 1 << 16 and b.bin_size(100) == 1024
    with pytest.raises(TypeError, match="bogus"):
        mrkit.reinitialize(bogus=True)


def test_rmm_statistics_functions(sim):
    import mrkit.statistics as ms
    mr = ms.enable_statistics()
    assert ms.push_statistics() == mr.statistics
    p = mr.allocate(1000, DEFAULT_STREAM)
    popped = ms.pop_statistics()
    assert popped.total_bytes == 1000
    mr.deallocate(p, 1000, DEFAULT_STREAM)
    with ms.profiler(name="region"):
        mr.deallocate(mr.allocate(512, DEFAULT_STREAM), 512, DEFAULT_STREAM)
    assert ms.default_profiler_records.records == ms.profiler_records()
    assert ms.default_profiler_records.records["region"].total_bytes == 512
    assert "region" in ms.default_profiler_records.report()


def test_cupy_pool_names_on_a_pool(sim):
    pool = PoolResource(DeviceMemoryResource())
    p = pool.allocate(1000, DEFAULT_STREAM)
    assert pool.used_bytes() == 1024 and pool.total_bytes() == pool.pool_size > 0
    pool.deallocate(p, 1000, DEFAULT_STREAM)
    assert pool.free_bytes == pool.total_bytes() and pool.free_all_blocks() is None
    assert pool.total_bytes() == 0


def test_statistics_scopes_and_profiler_restore_the_resource_they_wrapped(sim):
    import mrkit.statistics as ms
    base = mrkit.get_current_resource(0)
    with ms.statistics() as s:
        inner = mrkit.get_current_resource(0)
        assert isinstance(inner, StatisticsAdaptor)
        p = inner.allocate(100, DEFAULT_STREAM)
        inner.deallocate(p, 100, DEFAULT_STREAM)
    assert mrkit.get_current_resource(0) is base and s.total_bytes == 100

    @ms.profiler(name="f")
    def f():
        mr = mrkit.get_current_resource(0)
        mr.deallocate(mr.allocate(10, DEFAULT_STREAM), 10, DEFAULT_STREAM)
    f()
    assert mrkit.get_current_resource(0) is base
    stats = ms.enable_statistics()  # enabled by the user: it stays, and scopes use it
    with ms.statistics():
        assert mrkit.get_current_resource(0) is stats
    assert mrkit.get_current_resource(0) is stats


def test_extras_and_typing_marker():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as fh:
        meta = tomllib.load(fh)
    extras = meta["project"]["optional-dependencies"]
    for name in ("testing", "numba", "torch", "all", "test"):
        assert name in extras, name
    assert any("mrkit[" in d for d in extras["test"])  # test reuses the others
    assert os.path.exists(os.path.join(HERE, "mrkit", "py.typed"))
    data = meta["tool"]["setuptools"]["package-data"]["mrkit"]
    assert "py.typed" in data
    # the compiled core's C++ header ships beside its .pyx, so that an sdist builds the extension
    assert "_engine/*.h" in data and os.path.exists(os.path.join(HERE, "mrkit", "_engine", "_freetree.h"))
