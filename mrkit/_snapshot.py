"""Memory snapshots in the format PyTorch's memory_viz opens (``torch.cuda.memory._snapshot()``).

``snapshot(mr)`` walks ``mr``'s adaptors down to the caching resource (a pool, a VMM, binning) and
describes its heap: one *segment* per chunk it holds (an upstream allocation, or a carved virtual
range), split into *blocks* — live (``active_allocated``, with the stack where a
:class:`~mrkit.TrackingAdaptor` with ``capture_stacks=True`` saw it made) and free (``inactive``).
``device_traces`` holds one ``alloc`` event per live block (from the tracking adaptor, with frames)
or, when a :class:`~mrkit.LoggingAdaptor` log is given, the log's whole history. ``dump_snapshot``
pickles it; open the file at https://pytorch.org/memory_viz or with ``torch.cuda._memory_viz``.
"""
from __future__ import annotations

import bisect
import pickle
import re

from ._current import get_current_resource
from ._engine import GRAIN
from ._resource import MemoryResource, upstream_chain
from .adaptors import TrackingAdaptor, read_log

__all__ = ["snapshot", "dump_snapshot", "snapshot_from_log"]

_FRAME = re.compile(r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)')


def _frames(stack_text: str | None) -> list[dict]:
    """A captured stack (``traceback.format_stack`` text) as memory_viz frames, innermost first."""
    if not stack_text:
        return []
    frames = [{"filename": m["file"], "line": int(m["line"]), "name": m["name"].strip()}
              for m in map(_FRAME.match, stack_text.splitlines()) if m]
    return frames[::-1]


def snapshot(mr: MemoryResource | None = None) -> dict:
    """The heap of ``mr`` (default: the current resource) as a memory_viz snapshot dict:
    ``{"segments": [...], "device_traces": [[...]]}``. Without a caching resource in the stack (the
    driver's pool, cuMemAlloc, managed memory), each live allocation is a segment of its own, as
    PyTorch draws memory it got straight from the driver. ``ValueError`` when ``mr`` keeps no record
    of what it handed out (host or pinned memory under no pool)."""
    mr = mr or get_current_resource()
    layers = upstream_chain(mr)
    cache = next((r for r in layers if getattr(r, "arena", None) is not None), None)
    tracking = next((r for r in layers if isinstance(r, TrackingAdaptor)), None)
    if cache is None:
        return _direct_snapshot(mr, layers, tracking)
    arena = cache.arena
    dev = cache.device_id or 0
    with arena.lock:
        live = arena.live.copy()  # one step (a dict, or the compiled AddressTable)
        aligned = {block: (size, n, ptr) for ptr, (block, size, n, _) in arena.aligned.items()}
        free = []
        for st in list(arena.states.values()):
            handle = getattr(st.stream, "handle", 0)
            free += [(p, s, handle) for p, s in st.free.items()]
            for size, ptrs in list((st.cache or {}).items()):
                free += [(p, size, handle) for p in list(ptrs)]
        chunks = sorted(arena.chunks.items())
    stacks = {}  # ptr -> the stack text captured where it was allocated
    if tracking is not None:
        stacks = {p: stack for p, (_, stack) in tracking.records().items()}
    blocks_of: dict[int, list] = {base: [] for base, _ in chunks}
    bases = [b for b, _ in chunks]
    ends = [b + n for b, n in chunks]

    def owner(p):
        i = bisect.bisect_right(bases, p) - 1
        return bases[i] if i >= 0 and p < ends[i] else None

    traces = []
    for p, n in live.items():
        size = -(-n // GRAIN) * GRAIN  # the block the engine holds for it
        frames = _frames(stacks.get(p))
        b = owner(p)
        if b is not None:
            blocks_of[b].append({"address": p, "size": size, "requested_size": n, "state": "active_allocated",
                                 "frames": frames})
        traces.append({"action": "alloc", "addr": p, "size": size, "stream": 0, "frames": frames, "time_us": 0})
    for block, (size, n, ptr) in aligned.items():
        b = owner(block)
        if b is not None:
            blocks_of[b].append({"address": block, "size": size, "requested_size": n, "state": "active_allocated",
                                 "frames": _frames(stacks.get(ptr))})
    for p, s, handle in free:
        b = owner(p)
        if b is not None:
            blocks_of[b].append({"address": p, "size": s, "requested_size": 0, "state": "inactive", "frames": []})
    segments = [_segment(dev, base, size, sorted(blocks_of[base], key=lambda x: x["address"]))
                for base, size in chunks]
    return _assemble(dev, segments, traces)


def _segment(dev: int, base: int, size: int, blocks: list, frames=()) -> dict:
    """One memory_viz segment holding ``blocks``."""
    allocated = sum(x["size"] for x in blocks if x["state"] == "active_allocated")
    return {"device": dev, "address": base, "total_size": size, "allocated_size": allocated,
            "active_size": allocated, "requested_size": sum(x["requested_size"] for x in blocks),
            "stream": 0, "segment_type": "large" if size > (1 << 20) else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": list(frames), "blocks": blocks}


def _assemble(dev: int, segments: list, traces: list) -> dict:
    device_traces = [[] for _ in range(dev + 1)]
    device_traces[dev] = traces
    return {"segments": segments, "device_traces": device_traces, "allocator_settings": {}}


def _direct_snapshot(mr, layers, tracking) -> dict:
    """A snapshot of a resource that hands out driver allocations directly: a segment per allocation."""
    bottom = layers[-1]
    if tracking is not None:
        live = {p: (n, stack) for p, (n, stack) in tracking.records().items()}
    elif hasattr(bottom, "outstanding"):
        live = {p: (n, None) for p, n in bottom.outstanding().items()}
    else:
        raise ValueError(f"{mr!r} keeps no record of its allocations to take a snapshot of "
                         "(wrap it in TrackingAdaptor, or take one of a pool)")
    dev = bottom.device_id or 0
    segments, traces = [], []
    for p, (n, stack) in sorted(live.items()):
        size = -(-n // GRAIN) * GRAIN
        frames = _frames(stack)
        block = {"address": p, "size": size, "requested_size": n, "state": "active_allocated", "frames": frames}
        segments.append(_segment(dev, p, size, [block], frames))
        traces.append({"action": "alloc", "addr": p, "size": size, "stream": 0, "frames": frames, "time_us": 0})
    return _assemble(dev, segments, traces)


def snapshot_from_log(log, device: int = 0) -> dict:
    """A memory_viz snapshot whose trace is an allocation log's history (mrkit's or RMM's CSV):
    ``alloc``/``free_requested``/``free_completed`` per event, ``oom`` for failures; no segments."""
    events = read_log(log) if not isinstance(log, list) else log
    t0 = events[0].time if events else 0.0
    trace = []
    for e in events:
        t = int((e.time - t0) * 1e6)
        if e.action == "allocate":
            trace.append({"action": "alloc", "addr": e.pointer, "size": e.size, "stream": e.stream,
                          "frames": [], "time_us": t})
        elif e.action == "free":
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": e.pointer, "size": e.size, "stream": e.stream,
                              "frames": [], "time_us": t})
        else:
            trace.append({"action": "oom", "addr": 0, "size": e.size, "stream": e.stream, "frames": [],
                          "time_us": t, "device_free": 0})
    return _assemble(device, [], trace)


def dump_snapshot(path, mr: MemoryResource | None = None) -> dict:
    """Write :func:`snapshot` of ``mr`` (default: the current resource) to ``path`` as a pickle that
    PyTorch's memory_viz opens; returns the snapshot."""
    snap = snapshot(mr)
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    return snap
