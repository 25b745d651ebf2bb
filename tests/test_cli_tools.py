"""`mrkit bench`, `mrkit plot`, `mrkit replay --json` and the demo's picture, on the simulator: the
tests read the JSON and the files the commands write, not only what they print."""
from __future__ import annotations

import io
import json
import sys
import types

import pytest

import mrkit
from mrkit import DEFAULT_STREAM, LoggingAdaptor, PoolResource, DeviceMemoryResource, Stream
from mrkit._cli import main
from mrkit._plot import memory_timeline


def _run(capsys, *argv):
    code = main(["--debug", *argv] if argv and argv[0] != "--no-debug" else list(argv[1:]))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def log(sim, tmp_path):
    """A log of two streams: 3 MiB on the default stream, 1 MiB + 2 MiB on another, one freed."""
    path = tmp_path / "mem.csv"
    mr = LoggingAdaptor(PoolResource(DeviceMemoryResource()), path)
    s = Stream.create()
    a = mr.allocate(3 << 20, DEFAULT_STREAM)
    b = mr.allocate(1 << 20, s)
    c = mr.allocate(2 << 20, s)
    mr.deallocate(b, 1 << 20, s)
    mr.deallocate(a, 3 << 20, DEFAULT_STREAM)
    mr.deallocate(c, 2 << 20, s)
    mr.close()
    return path, s.handle


def test_memory_timeline_counts_per_stream_and_finds_the_peak(log):
    path, h = log
    tl = memory_timeline(path)
    assert tl.total == [3 << 20, 4 << 20, 6 << 20, 5 << 20, 2 << 20, 0]
    assert tl.per_stream[0] == [3 << 20, 3 << 20, 3 << 20, 3 << 20, 0, 0]
    assert tl.per_stream[h] == [0, 1 << 20, 3 << 20, 2 << 20, 2 << 20, 0]
    assert tl.peak == 6 << 20 and tl.times == sorted(tl.times) and tl.failures == []


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".html", b"<!doctype html>")])
def test_plot_writes_the_picture(capsys, log, tmp_path, suffix, magic):
    path, _ = log
    out = tmp_path / f"mem{suffix}"
    code, text, _ = _run(capsys, "plot", str(path), "-o", str(out))
    assert code == 0 and "peak 6.0 MiB" in text and "2 streams" in text
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 5_000
    if suffix == ".html":
        assert b"data:image/png;base64," in data and b"6.0 MiB" in data


def test_plot_refuses_an_unknown_format_and_says_what_to_install(capsys, log, tmp_path, monkeypatch):
    path, _ = log
    with pytest.raises(SystemExit) as e:  # refused when the flags are read, before any work
        _run(capsys, "--no-debug", "plot", str(path), "-o", str(tmp_path / "x.jpg"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unsupported extension '.jpg'" in err and ".png, .svg, .pdf, .html" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    code, _, err = _run(capsys, "--no-debug", "plot", str(path), "-o", str(tmp_path / "x.png"))
    assert code == 1 and "mrkit[plot]" in err and not (tmp_path / "x.png").exists()


def test_replay_json_reports_each_resource(capsys, log):
    path, _ = log
    code, text, _ = _run(capsys, "replay", str(path), "--json", "--quiet", "--resource", "pool(device)",
                         "--resource", "statistics(device)", "--backend", "sim")
    assert code == 0
    doc = json.loads(text[text.index("{"):])
    assert [r["resource"] for r in doc["results"]] == ["pool(device)", "statistics(device)"]
    for r in doc["results"]:
        assert r["events"] == 6 and r["peak_live_bytes"] == 6 << 20 and r["failures"] == 0
    assert doc["results"][1]["statistics_peak_bytes"] == 6 << 20


def test_replay_reports_progress(log):
    path, _ = log
    seen = []
    events = mrkit.read_log(path) * 1  # 6 events: one call with the rest
    r = mrkit.replay(events, PoolResource(DeviceMemoryResource()), progress=seen.append)
    assert r.events == 6 and sum(seen) == 6


def test_bench_json_measures_each_workload(capsys, sim):
    code, text, _ = _run(capsys, "bench", "--json", "--quiet", "--ops", "400", "--rounds", "2",
                         "--backend", "sim", "--workload", "pairs", "--workload", "random")
    assert code == 0
    doc = json.loads(text)
    assert doc["backend"] == "sim" and doc["allocators"] == ["mrkit pool(device)"]
    assert list(doc["workloads"]) == ["pairs", "random"]
    assert all(v["mrkit pool(device)"] > 0 for v in doc["workloads"].values())
    assert doc["ratios"] == {"pairs": {}, "random": {}}  # no CuPy/PyTorch on the simulator


def test_bench_table_and_bad_spec(capsys):
    code, text, _ = _run(capsys, "bench", "--quiet", "--ops", "200", "--rounds", "1", "--backend", "sim",
                         "--resource", "statistics(pool(device))", "--workload", "batch")
    assert code == 0 and "batch" in text and "mrkit measured alone" in text
    with pytest.raises(SystemExit) as e:  # a bad spec is a usage error, refused before any work
        _run(capsys, "--no-debug", "bench", "--backend", "sim", "--resource", "pool(nothing)")
    assert e.value.code == 2 and "unknown resource 'nothing'" in capsys.readouterr().err


def test_bench_plans_keep_live_bytes_under_the_cap():
    from mrkit._bench import workload_plan
    for w in ("random", "streams"):
        plan = workload_plan(w, 5000, cap=64 << 20, seed=3)
        live = used = 0
        for kind, a, _ in plan:
            used += a if kind == "a" else -plan[a][1]
            live = max(live, used)
        assert used == 0 and live <= 64 << 20
        assert {b for k, _, b in plan if k == "a"} == ({0, 1, 2, 3} if w == "streams" else {0})
    with pytest.raises(ValueError, match="workload must be one of"):
        workload_plan("nonsense", 10, 1 << 20)


def test_demo_draws_memory_over_time(capsys, tmp_path):
    out = tmp_path / "demo.png"
    code, text, _ = _run(capsys, "demo", "--backend", "sim", "--ops", "600", "--quiet", "--plot", str(out))
    assert code == 0 and f"memory over time: {out}" in text
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 10_000
    code, text, _ = _run(capsys, "demo", "--backend", "sim", "--ops", "100", "--quiet", "--no-plot")
    assert code == 0 and "memory over time" not in text
