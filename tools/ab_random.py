"""The pool's RMM random workload (sizes to 8 MiB, ``bench_pool.random_workload``) for this tree and an
earlier one, each run in its own process, the trees taking turns: ns per operation, the best and the
median pass, with new sizes each pass and replayed, and the pool's footprint; on the simulator unless
``MRKIT_BACKEND`` says otherwise (both builds: ``MRKIT_NO_EXTENSIONS=1`` for the Python one).

    python tools/ab_random.py OLD_TREE [--runs 3] [--ops 10000] [--passes 8]

``OLD_TREE`` is a checkout or ``git archive`` of the earlier tree with its extension built in place
(``python setup.py build_ext --inplace`` there). This tree's benchmark scripts run for both."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, os, statistics, sys
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import mrkit
from mrkit.driver import SimDeviceSpec, SimDriver
if os.environ.get("MRKIT_BACKEND", "sim") == "sim":
    mrkit.set_backend(SimDriver(devices=[SimDeviceSpec(total_memory=141 << 30)]))
import bench_pool as bp
ops, passes = int(sys.argv[2]), int(sys.argv[3])
peer = bp.mrkit_peer("pool", [mrkit.Stream.create(0) for _ in range(8)])
for k in range(3):
    bp.random_workload(peer, ops, seed=100 + k, replay=False)
fresh = [bp.random_workload(peer, ops, seed=200 + k, replay=False) * 1000 for k in range(passes)]
replayed = [bp.random_workload(peer, ops, seed=400 + k, replay=True) * 1000 for k in range(passes)]
print(json.dumps({"file": mrkit.__file__, "core": mrkit._engine.core_name(), "fresh": fresh,
                  "replayed": replayed, "footprint": peer[2]()}))
"""


def run_child(tree: Path, child: str, *args) -> dict:
    """Run the program ``child`` (this tree's path and ``args`` on its command line) in its own process
    with ``tree``'s mrkit first on the path; the JSON object its last line prints (which must name
    the ``file`` mrkit was imported from, inside ``tree``)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", child, str(HERE), *map(str, args)], env=env,
                         cwd=str(tree), capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if not got["file"].startswith(str(tree)):
        raise SystemExit(f"{tree}: imported mrkit from {got['file']}")
    return got


def parse(doc: str, argv, runs: int, **options) -> argparse.Namespace:
    """The A/B scripts' command line: ``OLD_TREE``, ``--runs`` and ``options`` (name -> default int)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("--runs", type=int, default=runs)
    for name, default in options.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args(argv)
    if not (args.old / "mrkit" / "__init__.py").is_file():
        ap.error(f"{args.old} is not a tree of mrkit (no mrkit/__init__.py there)")
    return args


def _run(tree: Path, ops: int, passes: int) -> dict:
    return run_child(tree, _CHILD, ops, passes)


def main(argv=None) -> None:
    args = parse(__doc__, argv, 3, ops=10000, passes=8)
    trees = {"old": args.old.resolve(), "new": HERE}
    for k in range(args.runs):
        for name, tree in trees.items():
            r = _run(tree, args.ops, args.passes)
            fresh, replayed = sorted(r["fresh"]), sorted(r["replayed"])
            print(f"{name} ({r['core']}), run {k}: fresh {fresh[0]:.0f} ns best, {fresh[len(fresh) // 2]:.0f} median; "
                  f"replayed {replayed[0]:.0f} best, {replayed[len(replayed) // 2]:.0f} median; "
                  f"footprint {r['footprint'] / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
