"""Every example runs (on the simulator here, on the GPU machine with a GPU)."""
import pathlib
import runpy

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.fixture
def restore_cupy_allocator():
    """An example may make mrkit CuPy's allocator: later tests get CuPy's own back."""
    import sys
    cupy = sys.modules.get("cupy")
    old = cupy.cuda.get_allocator() if cupy is not None and hasattr(cupy.cuda, "get_allocator") else None
    yield
    cupy = sys.modules.get("cupy")
    if cupy is not None and hasattr(cupy.cuda, "set_allocator"):
        cupy.cuda.set_allocator(old if old is not None else cupy.get_default_memory_pool().malloc)


def _needs(path) -> list[str]:
    """The packages an example's docstring names on its ``Needs:`` line."""
    import re
    m = re.search(r"^Needs: ([\w\-, ]+)", path.read_text(), re.M)
    return [n.strip() for n in m.group(1).split(",")] if m else []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, capsys, restore_cupy_allocator):
    import importlib.util
    import warnings

    for need in _needs(path):
        if importlib.util.find_spec(need) is None:
            pytest.skip(f"{path.name} needs {need}, which is not installed here")

    from mrkit import SimulatorFallbackWarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", SimulatorFallbackWarning)  # every other warning stays an error
        runpy.run_path(str(path), run_name="__main__")
    assert len([w for w in seen if w.category is SimulatorFallbackWarning]) <= 1  # said once, if at all
    assert capsys.readouterr().out.strip()
