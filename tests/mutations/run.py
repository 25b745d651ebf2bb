"""Apply each planted bug of ``mutants.py`` to a fresh copy of the package and run the kit on it
under the ``ci`` profile, in parallel; report which mutants the kit missed.

    python tests/mutations/run.py [--jobs N] [--only SUBSTRING] [--profile ci]

Exit status 0 when the unmutated package passes and every mutant is caught, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mrkit"


@dataclass
class Outcome:
    name: str
    caught: bool
    detail: str
    seconds: float


def apply(m: Mutant, where: Path) -> None:
    """Copy the package to ``where`` and plant ``m`` (ValueError if its text is not there)."""
    shutil.copytree(PACKAGE, where / "mrkit", ignore=shutil.ignore_patterns("__pycache__"))
    target = where / "mrkit" / m.path
    text = target.read_text()
    if m.old not in text:
        raise ValueError(f"mutant {m.name!r}: its text no longer occurs in mrkit/{m.path}; update mutants.py")
    target.write_text(text.replace(m.old, m.new))


def run_kit_on(pythonpath: Path | None, targets, profile: str, timeout: float,
               kit: str = "machine", python_core: bool = False) -> subprocess.CompletedProcess | None:
    """The kit on ``targets`` in a subprocess; ``python_core``: with the engine's Python build forced
    (a bug planted in ``_engine/_hot.py`` lives only there; every other mutant runs on the build that
    is installed, compiled or not)."""
    env = dict(os.environ, HYPOTHESIS_PROFILE=profile, PYTHONDONTWRITEBYTECODE="1", MRKIT_TEST_BACKEND="sim")
    if python_core:
        env["MRKIT_NO_EXTENSIONS"] = "1"
    env.pop("MRKIT_RESOURCE", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    try:
        phase = ["--races-only"] if kit == "races" else ["--no-races"]
        return subprocess.run([sys.executable, "-m", "mrkit.testing", "--profile", profile, "--no-shrink",
                               *phase, *targets], env=env, cwd=pythonpath or ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def run_one(m: Mutant, profile: str, timeout: float) -> Outcome:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mrkit-mutant-") as tmp:
        apply(m, Path(tmp))
        # the engine's bugs are planted in its Python build (the compiled one is its twin, held to it by
        # tests/test_core.py and tests/test_freelist.py), so the kit runs that build on them
        proc = run_kit_on(Path(tmp), m.targets, profile, timeout, m.kit, python_core=m.path.startswith("_engine/"))
    dt = time.perf_counter() - t0
    if proc is None:
        return Outcome(m.name, False, f"the kit hung (no verdict within {timeout:.0f} s)", dt)
    if proc.returncode == 1:
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL")]
        return Outcome(m.name, True, found[0] if found else proc.stdout.strip()[-200:], dt)
    if proc.returncode == 0:
        return Outcome(m.name, False, "the kit passed", dt)
    return Outcome(m.name, False, f"the kit crashed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}", dt)


def run_all(jobs: int | None = None, only: str | None = None, profile: str = "ci",
            timeout: float = 240.0, baseline: bool = True) -> tuple[list[Outcome], str | None]:
    """(outcomes, baseline failure or None). The baseline is the unmutated package on every target
    (a mutant "caught" by a kit that fails anyway proves nothing); ``baseline=False`` skips it where
    another test already runs the kit on the unmutated package (tests/test_kit.py)."""
    chosen = [m for m in MUTANTS if not only or only in m.name]
    targets = sorted({t for m in chosen for t in m.targets})
    base = run_kit_on(None, targets, profile, timeout) if baseline else None
    if baseline and (base is None or base.returncode != 0):
        return [], "the unmutated package fails the kit: " + ("hung" if base is None else base.stdout[-500:])
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        outcomes = list(pool.map(lambda m: run_one(m, profile, timeout), chosen))
    return outcomes, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--profile", default="ci")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    outcomes, baseline = run_all(args.jobs, args.only, args.profile)
    if baseline:
        print(baseline)
        return 1
    for o in outcomes:
        print(f"{'caught' if o.caught else 'MISSED'} {o.name} ({o.seconds:.1f} s): {o.detail}")
    missed = [o for o in outcomes if not o.caught]
    print(f"{len(outcomes) - len(missed)} of {len(outcomes)} mutants caught in {time.perf_counter() - t0:.0f} s "
          f"(profile {args.profile})")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
