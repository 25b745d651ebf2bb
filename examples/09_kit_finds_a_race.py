"""The testing kit on a pool with a planted ordering bug: it hands a block freed on one stream to
another stream without making the second wait. The kit finds it on the simulated device, shrinks
the failing interleaving to a few steps, and prints the story and the race report."""
from hypothesis import settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

import mrkit
from mrkit.testing import load_profile, make_state_machine


class HastyPool(mrkit.PoolResource):
    """A pool whose stream hand-over forgot the event (the bug class of rapidsai/rmm#2489)."""

    def __init__(self, upstream):
        super().__init__(upstream)
        self.arena.order_after = lambda src, dst: None


load_profile("ci")
Machine = make_state_machine(lambda drv: HastyPool(mrkit.CudaMemoryResource(driver=drv)), backend="sim")
story: list[str] = []
try:
    with with_reporter(story.append):
        run_state_machine_as_test(Machine, settings=settings(settings.get_profile("ci"), database=None))
except mrkit.StreamOrderViolation as exc:
    story += getattr(exc, "__notes__", [])
    print("\n".join(line for line in "\n".join(story).splitlines()
                    if not line.startswith(("state.bytes_agree", "state.no_overlap", "state.nothing_corrupted"))))
    print("\nthe race report:\n" + str(exc))
    steps = [ln for ln in "\n".join(story).splitlines() if ln.startswith("state.") and "(" in ln]
    assert len(steps) < 15, "the failing interleaving should shrink to a short story"
else:
    raise SystemExit("the kit did not find the planted race")
