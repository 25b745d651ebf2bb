"""Snapshots in PyTorch's memory_viz format, on the simulator (and PyTorch's own reader where present)."""
from __future__ import annotations

import pickle

import pytest

import mrkit
from mrkit import DEFAULT_STREAM, CudaMemoryResource, PoolResource, Stream, TrackingAdaptor, VirtualMemoryResource


def _allocate_here(mr, n, s):  # a named frame for the stack check
    return mr.allocate(n, s)


@pytest.mark.parametrize("kind", ["pool", "vmm"])
def test_snapshot_describes_segments_blocks_and_stacks(sim, tmp_path, kind):
    inner = PoolResource(CudaMemoryResource(driver=sim)) if kind == "pool" else VirtualMemoryResource(0, driver=sim)
    mr = TrackingAdaptor(inner, capture_stacks=True)
    s = Stream.create(driver=sim)
    a = _allocate_here(mr, 1000, s)
    b = _allocate_here(mr, 3 << 20, DEFAULT_STREAM)
    c = mr.allocate(5000, s)
    mr.deallocate(c, 5000, s)  # a free block, cached on s
    snap = mrkit.dump_snapshot(tmp_path / "snap.pickle", mr)
    with open(tmp_path / "snap.pickle", "rb") as f:
        assert pickle.load(f) == snap
    segs = snap["segments"]
    assert sum(x["total_size"] for x in segs) == inner.pool_size
    blocks = [blk for x in segs for blk in x["blocks"]]
    for x in segs:  # blocks tile their segment exactly: no gap, no overlap
        addr = x["address"]
        for blk in x["blocks"]:
            assert blk["address"] == addr
            addr += blk["size"]
        assert addr == x["address"] + x["total_size"]
        assert x["allocated_size"] == sum(blk["size"] for blk in x["blocks"] if blk["state"] == "active_allocated")
    live = {blk["address"]: blk for blk in blocks if blk["state"] == "active_allocated"}
    assert set(live) == {a, b} and live[a]["requested_size"] == 1000 and live[b]["size"] == 3 << 20
    assert live[a]["frames"][0]["name"] == "_allocate_here" and live[a]["frames"][0]["filename"] == __file__
    assert any(blk["state"] == "inactive" and blk["address"] == c for blk in blocks)
    trace = snap["device_traces"][0]
    assert {e["addr"] for e in trace if e["action"] == "alloc"} == {a, b}
    mr.deallocate(a, 1000, s)
    mr.deallocate(b, 3 << 20, DEFAULT_STREAM)


def test_snapshot_from_a_log_and_errors(sim, tmp_path):
    import io
    log = mrkit.LoggingAdaptor(PoolResource(CudaMemoryResource(driver=sim)), io.StringIO())
    p = log.allocate(4096, DEFAULT_STREAM)
    log.deallocate(p, 4096, DEFAULT_STREAM)
    log.flush()
    snap = mrkit.snapshot_from_log(log._file.getvalue())
    assert [e["action"] for e in snap["device_traces"][0]] == ["alloc", "free_requested", "free_completed"]
    with pytest.raises(ValueError, match="keeps no record of its allocations"):
        mrkit.snapshot(mrkit.HostMemoryResource())
    direct = CudaMemoryResource(driver=sim)  # no pool: each live allocation is its own segment
    q = direct.allocate(3000, DEFAULT_STREAM)
    segs = mrkit.snapshot(direct)["segments"]
    assert [(s["address"], s["total_size"], s["blocks"][0]["requested_size"]) for s in segs] == [(q, 3072, 3000)]
    direct.deallocate(q, 3000, DEFAULT_STREAM)
    assert mrkit.snapshot(direct)["segments"] == []


def test_memory_viz_renders_the_snapshot(sim, tmp_path):
    viz = pytest.importorskip("torch.cuda._memory_viz", reason="PyTorch is not installed here")
    mr = TrackingAdaptor(PoolResource(CudaMemoryResource(driver=sim)), capture_stacks=True)
    ptrs = [_allocate_here(mr, n, DEFAULT_STREAM) for n in (1000, 70000, 3 << 20)]
    mr.deallocate(ptrs[1], 70000, DEFAULT_STREAM)
    mrkit.dump_snapshot(tmp_path / "s.pickle", mr)
    with open(tmp_path / "s.pickle", "rb") as f:
        snap = pickle.load(f)
    for render in (viz.trace_plot, viz.segment_plot):
        html = render(snap)
        assert "<html" in html.lower() and len(html) > 1000
