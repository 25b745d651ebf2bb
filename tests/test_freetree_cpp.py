"""The compiled free list's containers (``mrkit/_engine/_freetree.h``) checked in C++ against the
standard library: ``tests/cpp/freetree_check.cpp``, built with AddressSanitizer and UBSan where the
compiler has them, must answer as ``std::set`` and a plain model do; and the check must catch bugs
planted in the header (a mutation suite of its own, each mutant a copy of the header)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HEADER = HERE.parent / "mrkit" / "_engine" / "_freetree.h"
CHECK = HERE / "cpp" / "freetree_check.cpp"
CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")

pytestmark = [
    pytest.mark.skipif(CXX is None, reason="no C++ compiler on this machine (the compiled core is not built either)"),
    pytest.mark.skipif(os.environ.get("MRKIT_NO_EXTENSIONS", "").strip() not in ("", "0"),
                       reason="the compiled core's header: checked in the run of the compiled build"),
]


def _build_and_run(tmp_path: Path, header_text: str, sanitize: bool) -> subprocess.CompletedProcess:
    inc = tmp_path / "inc"
    inc.mkdir(exist_ok=True)
    (inc / "_freetree.h").write_text(header_text)
    exe = tmp_path / "check"
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"] if sanitize else []
    built = subprocess.run([CXX, "-std=c++17", "-O1", "-g", *flags, "-I", str(inc), "-o", str(exe), str(CHECK)],
                           capture_output=True, text=True, timeout=120)
    if built.returncode and sanitize:  # a compiler without the sanitizers' runtime: plain build
        return _build_and_run(tmp_path, header_text, False)
    assert built.returncode == 0, built.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)


def test_the_containers_answer_as_the_standard_library(tmp_path):
    run = _build_and_run(tmp_path, HEADER.read_text(), sanitize=True)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


MUTANTS = {
    # a full leaf split, then the new key put in the wrong half
    "split half": ("            if (mk_lt(last_[i], k)) {  // past", "            if (!mk_lt(last_[i], k)) {  // past"),
    # the binary search without its last step (the place past a smaller last key)
    "search end": ("    return (size_t)(base - a) + (size_t)less(*base, k);", "    return (size_t)(base - a);"),
    # a re-key within the leaf that forgets the leaf's last key
    "stale last key": ("            last_[p.i] = d[c - 1];\n            return false;", "            return false;"),
    # a join with the next block that keeps its old size in the size index
    "join keeps size": ("            by_size.rekey(by_size.find(MkKey{nsize, nxt}), MkKey{size + nsize, ptr});",
                        "            by_size.rekey(by_size.find(MkKey{nsize, nxt}), MkKey{nsize, ptr});"),
    # a removal that leaves the leaf's last key as it was
    "erase keeps last": ("        last_[p.i] = l.back();\n        if (l.size() < MK_LEAF / 4) {", "        if (l.size() < MK_LEAF / 4) {"),
    # a boundary test that never finds the base
    "bounds miss": ("        return i < v_.size() && v_[i] == b;", "        return i + 1 < v_.size() && v_[i] == b;"),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_check_catches_a_planted_bug(tmp_path, name):
    old, new = MUTANTS[name]
    text = HEADER.read_text()
    assert text.count(old) == 1, f"the mutant {name!r} no longer applies to the header"
    run = _build_and_run(tmp_path, text.replace(old, new), sanitize=True)
    assert run.returncode != 0, f"the mutant {name!r} survived: {run.stdout}"
