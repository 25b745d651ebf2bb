"""The conformance suite: checks every resource must pass, as plain functions (no pytest needed)."""
from __future__ import annotations

import copy
import ctypes
import random
from dataclasses import dataclass
from typing import Callable

from .._errors import OutOfMemoryError
from .._resource import MemoryResource, driver_of
from .._stream import DEFAULT_STREAM, Event, Stream
from ..driver import Driver, get_driver

__all__ = ["Harness", "CHECKS", "run_conformance", "write_pattern", "read_back", "walk_stack"]


@dataclass
class Harness:
    """What the checks need: the resource under test and the driver its streams come from."""

    mr: MemoryResource
    driver: Driver | None

    def stream(self) -> Stream:
        return Stream.create(self.mr.device_id or 0, driver=self.driver)


def walk_stack(mr):
    out, seen = [], set()
    while isinstance(mr, MemoryResource) and id(mr) not in seen:
        seen.add(id(mr))
        out.append(mr)
        try:
            mr = object.__getattribute__(mr, "upstream")
        except AttributeError:
            break
    return out


def write_pattern(h: Harness, ptr: int, nbytes: int, value: int, stream) -> None:
    """Fill ``[ptr, ptr+nbytes)`` with ``value`` on ``stream`` (a memset for device-accessible
    memory, a host write otherwise)."""
    if h.mr.device_accessible:
        h.driver.memset_async(ptr, value, nbytes, stream.handle)
    else:
        ctypes.memset(ptr, value, nbytes)


def read_back(h: Harness, ptr: int, nbytes: int, stream) -> bytes:
    """Read ``nbytes`` at ``ptr`` after the work on ``stream`` (synchronises it)."""
    if h.mr.device_accessible:
        return h.driver.copy_to_host(ptr, nbytes, stream.handle)
    return ctypes.string_at(ptr, nbytes)


def _fail(msg: str):
    raise AssertionError(msg)


# -- the checks ------------------------------------------------------------------------------
def check_properties(h: Harness) -> None:
    mr = h.mr
    for name in ("device_accessible", "host_accessible"):
        if not isinstance(getattr(mr, name), bool):
            _fail(f"{name} must be a bool, got {getattr(mr, name)!r}")
    if not (mr.device_accessible or mr.host_accessible):
        _fail("a resource must be device- or host-accessible")
    dev = mr.device_id
    if dev is not None and (not isinstance(dev, int) or dev < 0):
        _fail(f"device_id must be None or an ordinal, got {dev!r}")
    if not (mr == mr) or hash(mr) != hash(mr):
        _fail("a resource must equal itself with a stable hash")
    if mr == object():
        _fail("a resource must not equal an unrelated object")
    if type(mr).__name__ not in repr(mr):
        _fail(f"repr should name the class: {mr!r}")
    ma = mr.max_alignment
    if ma < 256 or ma & (ma - 1):
        _fail(f"max_alignment must be a power of two >= 256, got {ma}")


def check_zero_size(h: Harness) -> None:
    if h.mr.allocate(0, DEFAULT_STREAM) != 0:
        _fail("allocate(0) must return 0")
    h.mr.deallocate(0, 0, DEFAULT_STREAM)


def check_alignment(h: Harness) -> None:
    mr, s = h.mr, DEFAULT_STREAM
    aligns = [1, 8, 64, 256] + [a for a in (512, 4096, 65536) if a <= mr.max_alignment]
    live = []
    try:
        for a in aligns:
            for n in (1, 255, 256, 257, 4099):
                p = mr.allocate(n, s, a)
                live.append((p, n, a))
                if p % a:
                    _fail(f"allocate({n}, alignment={a}) returned {p:#x}, not {a}-aligned")
                if a <= 256 and p % 256:
                    _fail(f"allocate({n}) returned {p:#x}, not 256-aligned (the default alignment)")
    finally:
        for p, n, a in live:
            mr.deallocate(p, n, s, a)


def check_distinct(h: Harness) -> None:
    mr, s = h.mr, DEFAULT_STREAM
    rng = random.Random(1234)
    live = []
    try:
        for _ in range(64):
            n = rng.choice([1, 100, 256, 1000, 4096, 65536, 100_000])
            live.append((mr.allocate(n, s), n))
        spans = sorted(live)
        for (p1, n1), (p2, n2) in zip(spans, spans[1:]):
            if p1 + n1 > p2:
                _fail(f"live allocations overlap: [{p1:#x}, +{n1}) and [{p2:#x}, +{n2})")
    finally:
        for p, n in live:
            mr.deallocate(p, n, s)


def check_impossible_size(h: Harness) -> None:
    mr, s = h.mr, DEFAULT_STREAM
    keep = mr.allocate(1024, s)
    try:
        try:
            p = mr.allocate(1 << 58, s)
        except OutOfMemoryError as exc:
            if str(1 << 58) not in str(exc) and "288230376151711744" not in str(exc):
                _fail(f"OutOfMemoryError should name the request ({1 << 58} bytes): {exc}")
        else:
            mr.deallocate(p, 1 << 58, s)
            _fail("allocate(2**58) must raise OutOfMemoryError")
        p = mr.allocate(4096, s)  # still usable
        mr.deallocate(p, 4096, s)
    finally:
        mr.deallocate(keep, 1024, s)


def _expect(exc_type, fn, what):
    try:
        fn()
    except exc_type:
        return
    except Exception as exc:  # noqa: BLE001
        _fail(f"{what}: expected {exc_type.__name__}, got {type(exc).__name__}: {exc}")
    _fail(f"{what}: expected {exc_type.__name__}, nothing was raised")


def check_bad_arguments(h: Harness) -> None:
    mr, s = h.mr, DEFAULT_STREAM
    _expect(ValueError, lambda: mr.allocate(-1, s), "allocate(-1)")
    _expect(TypeError, lambda: mr.allocate("10", s), "allocate('10')")
    _expect(TypeError, lambda: mr.allocate(1.5, s), "allocate(1.5)")
    _expect(ValueError, lambda: mr.allocate(64, s, 3), "alignment=3")
    _expect(ValueError, lambda: mr.allocate(64, s, 0), "alignment=0")
    _expect(ValueError, lambda: mr.allocate(64, s, mr.max_alignment * 2), "alignment above max_alignment")
    _expect(TypeError, lambda: mr.allocate(64, None), "stream=None")
    _expect(TypeError, lambda: mr.allocate(64, "stream"), "stream='stream'")
    p = mr.allocate(1000, s)
    try:
        _expect(ValueError, lambda: mr.deallocate(p + 256, 1000, s), "deallocate of a foreign pointer")
        _expect(ValueError, lambda: mr.deallocate(p, 999_999, s), "deallocate with the wrong size")
        # the live pointer and its size as floats equal to them: a dict look-up finds the block, so only
        # a type check refuses them (a resource that frees it, or keys its table by the float, is wrong)
        _expect(TypeError, lambda: mr.deallocate(float(p), 1000, s), "deallocate of the live pointer as a float")
        _expect(TypeError, lambda: mr.deallocate(p, 1000.0, s), "deallocate with the size as a float")
        # state unchanged: the real block is still live and frees once
        write_pattern(h, p, 1000, 7, s)
        if read_back(h, p, 1000, s) != b"\x07" * 1000:
            _fail("the block changed after rejected deallocations")
    except AssertionError:
        try:  # a rejected free may have freed the block after all: the finding is what is reported
            mr.deallocate(p, 1000, s)
        except Exception:  # noqa: BLE001
            pass
        raise
    mr.deallocate(p, 1000, s)  # the block is still live: this free must work
    _expect(ValueError, lambda: mr.deallocate(p, 1000, s), "double free")


def check_memory_usable(h: Harness) -> None:
    mr = h.mr
    s = h.stream() if mr.device_accessible else DEFAULT_STREAM
    try:
        blocks = [(mr.allocate(n, s), n, i + 1) for i, n in enumerate((1, 300, 4096, 1 << 20))]
        for p, n, v in blocks:
            write_pattern(h, p, n, v, s)
        for p, n, v in blocks:
            got = read_back(h, p, n, s)
            if got != bytes([v]) * n:
                _fail(f"block [{p:#x}, +{n}) did not keep its pattern {v}: first bytes {got[:8]!r}")
        for p, n, _ in blocks:
            mr.deallocate(p, n, s)
    finally:
        if mr.device_accessible:
            s.synchronize()
            s.close()


def check_cross_stream_free(h: Harness) -> None:
    mr = h.mr
    if not mr.device_accessible:
        return
    s, t = h.stream(), h.stream()
    try:
        p = mr.allocate(4096, s)
        write_pattern(h, p, 4096, 3, s)
        ev = Event.create(mr.device_id or 0, driver=h.driver)
        ev.record(s)
        t.wait(ev)
        mr.deallocate(p, 4096, t)  # ordered after s's use through the event
        q = mr.allocate(4096, t)
        write_pattern(h, q, 4096, 4, t)
        if read_back(h, q, 4096, t) != b"\x04" * 4096:
            _fail("memory freed on another stream was not usable again")
        mr.deallocate(q, 4096, t)
        ev.close()
    finally:
        for x in (s, t):
            x.synchronize()
            x.close()


def check_copies(h: Harness) -> None:
    """``copy.copy`` and ``copy.deepcopy`` make no second owner of the resource's memory: the copy is
    the resource itself, or copying is refused, or else the copy neither hands out a block the original
    also hands out nor frees the original's blocks a second time."""
    mr, s = h.mr, DEFAULT_STREAM
    mine: list = []  # (owner, ptr, nbytes) to give back
    failed = False
    try:
        for how in (copy.copy, copy.deepcopy):
            kept = mr.allocate(4096, s)
            mine.append((mr, kept, 4096))
            spare = mr.allocate(4096, s)
            mr.deallocate(spare, 4096, s)  # a free block a copied free list would hold too
            try:
                dup = how(mr)
            except Exception:  # refused: no second owner
                continue
            if dup is mr:
                continue
            a = mr.allocate(4096, s)
            mine.append((mr, a, 4096))
            b = dup.allocate(4096, s)
            mine.append((dup, b, 4096))
            if a and b and a < b + 4096 and b < a + 4096:
                _fail(f"copy.{how.__name__} of the resource hands out [{b:#x}, +4096) while the original "
                      f"also handed out [{a:#x}, +4096): both own the memory")
            mine.remove((mr, kept, 4096))
            mr.deallocate(kept, 4096, s)
            try:
                dup.deallocate(kept, 4096, s)
            except (ValueError, TypeError):
                continue
            _fail(f"a block freed through the resource was freed again through its copy.{how.__name__}: "
                  f"the copy owned {kept:#x} too")
    except AssertionError:
        failed = True
        raise
    finally:
        for owner, p, n in mine:
            try:
                owner.deallocate(p, n, s)
            except Exception:  # noqa: BLE001 - after a finding, a shared block frees once: report the finding
                if not failed:
                    raise


CHECKS: dict[str, Callable[[Harness], None]] = {
    "properties": check_properties,
    "zero_size": check_zero_size,
    "alignment": check_alignment,
    "distinct": check_distinct,
    "impossible_size": check_impossible_size,
    "bad_arguments": check_bad_arguments,
    "memory_usable": check_memory_usable,
    "cross_stream_free": check_cross_stream_free,
    "copies": check_copies,
}


def run_conformance(factory: Callable[[], MemoryResource], checks=None) -> list[str]:
    """Run the conformance checks on fresh resources from ``factory()``; raise ``AssertionError``
    naming the first check that fails; return the names of the checks run."""
    names = list(checks or CHECKS)
    for name in names:
        mr = factory()
        h = Harness(mr, driver_of(mr) or (get_driver() if mr.device_accessible else None))
        try:
            CHECKS[name](h)
        except AssertionError as exc:
            raise AssertionError(f"conformance check {name!r} failed for {mr!r}: {exc}") from None
    return names
