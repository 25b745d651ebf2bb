"""``python -m mrkit.testing [names...]``: run the kit on shipped resources; exit 1 if it finds anything."""
from __future__ import annotations

import argparse
import sys
import time

from ._kit import run_kit
from ._registry import BUILTIN_FACTORIES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mrkit.testing", description=__doc__)
    ap.add_argument("names", nargs="*", help=f"factories to test (default: all): {', '.join(BUILTIN_FACTORIES)}")
    ap.add_argument("--profile", default="ci", help="Hypothesis profile: ci, dev, gpu, nightly")
    ap.add_argument("--no-shrink", action="store_true", help="report findings without shrinking them")
    ap.add_argument("--backend", choices=["sim", "cuda"], default=None)
    phase = ap.add_mutually_exclusive_group()
    phase.add_argument("--no-races", action="store_true", help="skip the race test (controlled thread interleavings)")
    phase.add_argument("--races-only", action="store_true", help="run the race test alone")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    def report(name, found, seconds):  # each verdict as it is known: a deep profile takes minutes a resource
        print(f"{'FAIL' if found else 'ok  '} {name} ({seconds:.1f} s)" + (f": {found}" if found else ""), flush=True)

    try:
        results = run_kit(args.names or None, profile=args.profile, shrink=not args.no_shrink, backend=args.backend,
                          races="only" if args.races_only else not args.no_races, on_result=report)
    except ValueError as exc:
        print(f"mrkit.testing: error: {exc}", file=sys.stderr)
        return 2
    bad = sum(1 for f in results.values() if f)
    print(f"{len(results) - bad} passed, {bad} failed in {time.perf_counter() - t0:.1f} s (profile {args.profile})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
