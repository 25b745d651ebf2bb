"""Run the whole kit (conformance suite and state machine) on named resources: ``run_kit`` and
``python -m mrkit.testing``."""
from __future__ import annotations

import time
from typing import Callable

from ..driver import Driver
from ._machine import default_backend, make_state_machine
from ._races import race_test
from ._registry import BUILTIN_FACTORIES

__all__ = ["run_kit"]


def run_kit(factories: dict[str, Callable[[Driver], object]] | list[str] | None = None, *,
            profile: str = "ci", shrink: bool = True, backend: str | None = None,
            races: bool | str = True, on_result: Callable[[str, str | None, float], None] | None = None,
            ) -> dict[str, str | None]:
    """Run the conformance suite and the state machine on each factory (a dict name -> factory, or
    names of :data:`BUILTIN_FACTORIES`; default: all of them) under the Hypothesis ``profile``.
    Returns name -> None when the kit passed, else the first line of what it found. With
    ``shrink=False`` a failure is reported as found, without shrinking it (for mutation runs, where
    only detection matters; the run then stops at the first finding). ``races``: also race-test each resource with 2–4 threads in controlled
    interleavings (:func:`race_test`, on the simulator only); ``races="only"``: the race test alone.
    ``on_result(name, found, seconds)`` is called as each factory's verdict is known (progress for long
    profiles: ``nightly`` takes minutes a factory)."""
    from hypothesis import Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from . import register_profiles, run_conformance

    if factories is None:
        factories = dict(BUILTIN_FACTORIES)
    elif not isinstance(factories, dict):
        unknown = [n for n in factories if n not in BUILTIN_FACTORIES]
        if unknown:
            raise ValueError(f"unknown factories {unknown} (known: {sorted(BUILTIN_FACTORIES)})")
        factories = {n: BUILTIN_FACTORIES[n] for n in factories}
    register_profiles()
    base = settings.get_profile(profile)
    phases = tuple(p for p in base.phases if shrink or p not in (Phase.shrink, Phase.explain))
    s = settings(base, database=None, phases=phases, print_blob=shrink)
    results: dict[str, str | None] = {}
    for name, factory in factories.items():
        t0 = time.perf_counter()
        try:
            if races != "only":
                run_conformance(factory, backend=backend)
                run_state_machine_as_test(make_state_machine(factory, backend=backend), settings=s)
            if races and (backend or default_backend()) == "sim":
                race_test(factory, settings=s)
            results[name] = None
        except Exception as exc:  # noqa: BLE001 - every finding is reported, whatever its type
            first = (str(exc).strip().splitlines() or [""])[0]
            results[name] = f"{type(exc).__name__}: {first[:300]}"
        if on_result is not None:
            on_result(name, results[name], time.perf_counter() - t0)
        if results[name] is not None and not shrink:  # detection only (mutation runs): the first finding is the verdict
            break
    return results
