"""The kit proves itself: every planted bug of tests/mutations/mutants.py, applied to a copy of the
package, is caught by the kit under the ``ci`` profile (mutants run in parallel subprocesses).
The unmutated package passing the same kit is tests/test_kit.py's job."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "mutations"))

from mutants import MUTANTS  # noqa: E402
import run as mutation_run  # noqa: E402


def test_there_are_at_least_twenty_planted_bugs_across_the_package():
    assert len(MUTANTS) >= 20
    areas = {m.path.split("/")[0] if "/" in m.path else m.path for m in MUTANTS}
    assert {"_engine", "resources", "adaptors", "driver"} <= areas  # engine, VMM/binning, adaptors, checker


@pytest.mark.parametrize("m", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_still_applies(m, tmp_path):
    mutation_run.apply(m, tmp_path)  # raises when the code it plants into has changed


def test_the_kit_catches_every_planted_bug():
    outcomes, baseline = mutation_run.run_all(profile="ci", baseline=False)
    assert baseline is None
    missed = [f"{o.name}: {o.detail}" for o in outcomes if not o.caught]
    assert not missed, "the kit missed planted bugs:\n" + "\n".join(missed)
