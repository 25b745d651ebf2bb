"""Every ```python block of README.md and docs/*.md runs as written, on the simulator.

Blocks of one page run in order in one namespace, as a reader would type them, in a temporary folder.
A page sets up what its prose assumes (``mr``, a ``train_step``) in an HTML comment just above a
block, which readers do not see::

    <!-- doctest-setup
    mr = mrkit.PoolResource(mrkit.DeviceMemoryResource())
    -->

and ``<!-- doctest-needs: cupy gpu -->`` names what a block needs (a package, or ``gpu`` for a real
device): without it the block is skipped with that reason, never silently.
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import textwrap
import warnings
from pathlib import Path

import pytest

import mrkit
from mrkit.driver import SimDriver, set_backend

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_SETUP = re.compile(r"<!--\s*doctest-setup\s*\n(?P<code>.*?)-->", re.S)
_NEEDS = re.compile(r"<!--\s*doctest-needs:(?P<what>[^>]*)-->")


def blocks(page: Path):
    """``(line, code, setup, needs)`` for each python block of ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out, i, before = [], 0, []
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m["lang"]:
            if m:  # an unlabelled fence: skip to its end
                j = i + 1
                while j < len(lines) and not _FENCE.match(lines[j]):
                    j += 1
                i = j + 1
                before = []
                continue
            before.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _FENCE.match(lines[j]):
            j += 1
        if m["lang"] == "python":
            code = textwrap.dedent("\n".join(lines[i + 1:j]))
            head = "\n".join(before[-12:])
            setup = "\n".join(s["code"] for s in _SETUP.finditer(head))
            needs = " ".join(n["what"] for n in _NEEDS.finditer(head)).split()
            out.append((i + 1, code, textwrap.dedent(setup), needs))
        before = []
        i = j + 1
    return out


def _missing(needs: list[str]) -> str | None:
    for need in needs:
        if need == "gpu":
            return "needs a real GPU (the doc-test runs on the simulator)"
        if importlib.util.find_spec(need) is None:
            return f"needs {need}, which is not installed here"
    return None


@pytest.fixture
def busy_dask_port():
    """Dask's default dashboard port taken while a page runs, as on a machine already running a Dask
    cluster (or another test process): an example that binds it fails there (the guide's cluster
    did: Dask's warning that it moved to another port is an error in these tests)."""
    with socket.socket() as s:
        try:
            s.bind(("", 8787))
            s.listen()
        except OSError:  # already taken, which is the point
            pass
        yield


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch, busy_dask_port):
    found = blocks(page)
    if not found:
        pytest.skip(f"{page.name} has no python block")
    monkeypatch.chdir(tmp_path)
    set_backend(SimDriver())
    ns = {"__name__": f"doctest_{page.stem}", "mrkit": mrkit}
    ran, skipped = 0, []
    for line, code, setup, needs in found:
        why = _missing(needs)
        if why:
            skipped.append(f"{page.name}:{line}: {why}")
            continue
        for part, text in (("setup", setup), ("block", code)):
            if not text.strip():
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    exec(compile(text, f"{page.name}:{line} ({part})", "exec"), ns)
            except Exception as exc:
                raise AssertionError(f"{page.name}, the python block at line {line} ({part}) fails as "
                                     f"written: {type(exc).__name__}: {exc}\n{text}") from exc
        ran += 1
    for close in ns.get("__doctest_teardown__", ()):
        close()
    if skipped and not ran:
        pytest.skip("; ".join(skipped))
    assert ran, f"no block of {page.name} ran"


def test_the_collector_sees_setup_needs_and_indented_blocks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- doctest-setup\nx = 1\n-->\n<!-- doctest-needs: cupy -->\n```python\ny = x\n```\n"
                    "- item\n  ```python\n  z = 2\n  ```\n```text\nnot code\n```\n")
    got = blocks(page)
    assert [(c, s.strip(), n) for _, c, s, n in got] == [("y = x", "x = 1", ["cupy"]), ("z = 2", "", [])]
