"""The testing kit over every shipped resource, and the broken resources it must reject."""
from __future__ import annotations

import copy

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import mrkit
from mrkit import CudaMemoryResource, OutOfMemoryError, PoolResource, StatisticsAdaptor, StreamOrderViolation
from mrkit.resources import HostMemoryResource
from mrkit.testing import BUILTIN_FACTORIES, CHECKS, conformance_test_class, default_backend, make_state_machine, run_conformance

BACKEND = default_backend()
_gpu = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.mark.parametrize("name", sorted(BUILTIN_FACTORIES), ids=str)
def test_conformance(name, request):
    for m in _gpu:
        request.applymarker(m)
    if BACKEND == "cuda":
        request.getfixturevalue("gpu")
    assert run_conformance(BUILTIN_FACTORIES[name], backend=BACKEND) == list(CHECKS)


@pytest.mark.parametrize("name", sorted(BUILTIN_FACTORIES), ids=str)
def test_state_machine(name, request):
    if BACKEND == "cuda":
        request.getfixturevalue("gpu")
    run_state_machine_as_test(make_state_machine(BUILTIN_FACTORIES[name], backend=BACKEND))


TestHostConformance = conformance_test_class(lambda drv: HostMemoryResource(), backend="sim")


# -- broken resources: the kit must fail on each ---------------------------------------------
class NoWaitPool(PoolResource):
    """Takes another stream's free blocks without ordering the streams (rapidsai/rmm#2489's class of bug)."""

    def __init__(self, upstream):
        super().__init__(upstream)
        self.arena.order_after = lambda src, dst: None  # the engine's hand-over, planted bug


class OverlappingBump(CudaMemoryResource):
    """Carves blocks from one big allocation but steps one granule short: neighbours overlap."""

    def __init__(self, driver):
        super().__init__(driver=driver)
        self._base = self.driver.mem_alloc(0, 256 << 20)
        self._off = 0

    def _raw_alloc(self, nbytes):
        p = self._base + self._off
        self._off += max(256, -(-nbytes // 256) * 256 - 256)
        return p

    def _raw_free(self, ptr, stream):
        pass


class Misaligned(CudaMemoryResource):
    def _raw_alloc(self, nbytes):
        return super()._raw_alloc(nbytes + 64) + 32

    def _raw_free(self, ptr, stream):
        super()._raw_free(ptr - 32, stream)


class LosesFrees(PoolResource):
    """Forgets to give large blocks back: the memory is lost."""

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if nbytes > 4096:
            with self.arena.lock:
                del self.arena.live[ptr]
            return
        super().deallocate(ptr, nbytes, stream, alignment)


class DriftingStatistics(StatisticsAdaptor):
    """Subtracts the size rounded down to 256 bytes on free: counters drift."""

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        self._up_free(ptr, nbytes, stream, alignment)
        self._events.append(-(nbytes & ~255 if nbytes > 256 else nbytes))


class AcceptsDoubleFree(CudaMemoryResource):
    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if ptr not in self._live.live:
            return
        super().deallocate(ptr, nbytes, stream, alignment)


class FreesAFloat(HostMemoryResource):
    """Looks the pointer up in its table as given, as mrkit's own host resource did: a float equal to a
    live pointer frees it."""

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        entry = self._arrays.get(ptr)
        if entry is not None and entry[1] == nbytes:
            del self._arrays[ptr]
            return
        super().deallocate(ptr, nbytes, stream, alignment)


BROKEN = {
    "reuse across streams without a wait": (lambda d: NoWaitPool(CudaMemoryResource(driver=d)), StreamOrderViolation),
    "off-by-one overlap": (lambda d: OverlappingBump(d), (AssertionError, StreamOrderViolation)),
    "misaligned pointers": (lambda d: Misaligned(driver=d), AssertionError),
    "lost frees": (lambda d: LosesFrees(CudaMemoryResource(driver=d)), (AssertionError, KeyError)),
    "statistics that drift": (lambda d: DriftingStatistics(CudaMemoryResource(driver=d)), AssertionError),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_state_machine_rejects_broken_resource(name):
    factory, expected = BROKEN[name]
    machine = make_state_machine(factory, backend="sim", max_streams=4)
    ci = settings.get_profile("ci")
    with pytest.raises(expected):  # found under the ci profile (not shrunk: detection is what counts here)
        run_state_machine_as_test(machine, settings=settings(
            ci, database=None, phases=[p for p in ci.phases if p.name not in ("shrink", "explain")],
            report_multiple_bugs=False))


def test_a_race_shrinks_to_a_short_readable_story():
    """The planted hand-over race, shrunk: a handful of steps on two streams, the race report naming
    both operations, and the blob that replays it."""
    from hypothesis.reporting import with_reporter
    lines: list[str] = []
    machine = make_state_machine(BROKEN["reuse across streams without a wait"][0], backend="sim")
    with with_reporter(lines.append), pytest.raises(StreamOrderViolation) as info:
        run_state_machine_as_test(machine, settings=settings(settings.get_profile("ci"), database=None))
    text = "\n".join(lines + list(getattr(info.value, "__notes__", [])))  # notes: Hypothesis on 3.11+
    steps = [ln for ln in text.splitlines() if ln.startswith("state.") and "(" in ln
             and not any(k in ln for k in ("bytes_agree", "no_overlap", "nothing_corrupted", "teardown"))]
    assert 1 <= len(steps) <= 6, text
    assert "race:" in str(info.value) and "conflicts with" in str(info.value)
    assert "reproduce_failure" in text


@pytest.mark.parametrize("name,factory", [
    ("misaligned pointers", lambda d: Misaligned(driver=d)),
    ("off-by-one overlap", lambda d: OverlappingBump(d)),
    ("double free accepted", lambda d: AcceptsDoubleFree(driver=d)),
    ("a float pointer freed", lambda d: FreesAFloat()),
])
def test_conformance_rejects_broken_resource(name, factory):
    with pytest.raises(AssertionError, match="conformance check"):
        run_conformance(factory, backend="sim")


def test_conformance_rejects_a_resource_that_never_runs_out():
    class Infinite(HostMemoryResource):
        def allocate(self, nbytes, stream, alignment=256):
            return super().allocate(min(nbytes, 1 << 20), stream, alignment)

        def deallocate(self, ptr, nbytes, stream, alignment=256):
            super().deallocate(ptr, min(nbytes, 1 << 20), stream, alignment)

    with pytest.raises(AssertionError, match="impossible_size"):
        run_conformance(lambda d: Infinite(), backend="sim")


def test_out_of_memory_in_the_machine_leaves_state_intact():
    machine = make_state_machine(lambda d: mrkit.LimitingAdaptor(CudaMemoryResource(driver=d), 3 << 20), backend="sim")
    run_state_machine_as_test(machine, settings=settings(max_examples=30, stateful_step_count=40, deadline=None))
    with pytest.raises(OutOfMemoryError):
        mrkit.LimitingAdaptor(HostMemoryResource(), 10).allocate(11, mrkit.DEFAULT_STREAM)


class CopiedFreeLists(mrkit.MemoryResource):
    """Keeps freed blocks per size for reuse and deep-copies as a plain object does: the copy's free
    lists and table are duplicates, so the copy and the original hand out the same block, and a block
    freed through one is freed again through the other (mrkit's host resource copied its table so)."""

    device_accessible, host_accessible, device_id = True, False, 0

    def __init__(self, driver):
        self.up = CudaMemoryResource(driver=driver)
        self.cached, self.live = {}, {}

    def allocate(self, nbytes, stream, alignment=256):
        lst = self.cached.get(nbytes)
        p = lst.pop() if lst else self.up.allocate(nbytes, stream, alignment)
        self.live[p] = nbytes
        return p

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        if self.live.pop(ptr, None) != nbytes:
            raise ValueError(f"ptr {ptr:#x} is not live here with size {nbytes}")
        self.cached.setdefault(nbytes, []).append(ptr)

    def __deepcopy__(self, memo):  # plainly, as object.__reduce_ex__ would
        dup = object.__new__(type(self))
        dup.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return dup


class CopiedTable(CopiedFreeLists):
    """Deep-copies its table of live blocks but starts with no free blocks: only the second free of a
    block, through the copy, shows that both own it."""

    def __deepcopy__(self, memo):
        dup = super().__deepcopy__(memo)
        dup.cached = {}
        return dup


@pytest.mark.parametrize("factory", [lambda d: CopiedFreeLists(d), lambda d: CopiedTable(d)],
                         ids=["a copy hands out the original's free block", "a copy frees the original's block"])
def test_the_copies_check_rejects_a_resource_whose_copy_owns_its_memory(factory):
    with pytest.raises(AssertionError, match="check 'copies' failed.*(both own|owned)"):
        run_conformance(factory, checks=["copies"], backend="sim")


def test_the_copies_check_accepts_a_copy_that_owns_memory_of_its_own():
    class Fresh(CopiedFreeLists):
        def __deepcopy__(self, memo):
            return type(self)(self.up.driver)

    assert run_conformance(lambda d: Fresh(d), checks=["copies"], backend="sim") == ["copies"]


settings.register_profile("mrkit-test-tiny", max_examples=3, stateful_step_count=5, deadline=None)


def test_run_kit_reports_each_verdict_as_it_is_known():
    from mrkit.testing import run_kit

    def broken(drv):
        raise RuntimeError("this factory cannot build its resource")

    seen = []
    results = run_kit({"host": BUILTIN_FACTORIES["host"], "broken": broken, "cuda": BUILTIN_FACTORIES["cuda"]},
                      profile="mrkit-test-tiny", races=False,
                      on_result=lambda name, found, secs: seen.append((name, found, secs)))
    assert [n for n, _, _ in seen] == ["host", "broken", "cuda"]  # a finding does not stop the others
    assert seen[0][1] is None and seen[2][1] is None
    assert seen[1][1].startswith("RuntimeError: this factory cannot build")
    assert all(secs >= 0 for _, _, secs in seen)
    assert results == {n: f for n, f, _ in seen}


def test_the_kit_command_prints_each_resource_then_a_summary(capsys):
    from mrkit.testing.__main__ import main
    assert main(["--profile", "mrkit-test-tiny", "--no-races", "host", "cuda"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in lines[:2]] == ["ok   host", "ok   cuda"]
    assert lines[0].endswith(" s)") and lines[2].startswith("2 passed, 0 failed in ")
    assert main(["nope"]) == 2
    assert "unknown factories ['nope']" in capsys.readouterr().err
