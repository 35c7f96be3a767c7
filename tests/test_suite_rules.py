"""Rules of the test suite itself, checked on its source.

A test that bounds wall-clock time (``perf_counter() - start < 1.0``) measures the
machine as much as the code: beside other tests on two cores it fails at random (a
verifier's table case took 4.5 s instead of < 3 s with a CPU-bound neighbour running).
Such a test is marked ``serial`` (tests/conftest.py: it then runs while no other test
does), or bounds CPU time instead (``time.process_time``), which neighbours do not move.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "monotonic", "time"}


def _is_wall_clock_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def _is_elapsed(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Sub)
        and _is_wall_clock_call(node.left)
    )


def bounds_wall_time(fn: ast.FunctionDef) -> bool:
    """Whether ``fn`` asserts ``<clock>() - x < bound`` (or ``bound > ...``), directly or
    through a name assigned that difference (``elapsed = time.monotonic() - t0``)."""
    elapsed = {
        target.id
        for node in ast.walk(fn)
        if isinstance(node, ast.Assign) and _is_elapsed(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(fn):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in ast.walk(node.test):
            if not isinstance(cmp, ast.Compare):
                continue
            sides = [cmp.left, *cmp.comparators]
            for i, op in enumerate(cmp.ops):
                small = sides[i] if isinstance(op, ast.Lt | ast.LtE) else sides[i + 1]
                if not isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
                    continue
                if _is_elapsed(small) or (isinstance(small, ast.Name) and small.id in elapsed):
                    return True
    return False


def _marks(decorators: list[ast.expr]) -> set[str]:
    names = set()
    for d in decorators:
        text = ast.unparse(d)
        if text.startswith("pytest.mark."):
            names.add(text.removeprefix("pytest.mark.").split("(")[0])
    return names


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return {m.removeprefix("pytest.mark.") for m in ast.unparse(node.value).split(", ")}
    return set()


def unserial_wall_clock_tests(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    module_serial = any("serial" in m for m in _module_marks(tree))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            serial = module_serial or "serial" in _marks(node.decorator_list)
            if not serial and bounds_wall_time(node):
                found.append(f"{path.relative_to(root)}::{node.name}")
    return found


def test_the_rule_finds_a_wall_clock_bound_and_accepts_cpu_time_or_serial(tmp_path):
    (tmp_path / "m.py").write_text(
        "import time, pytest\n"
        "def test_wall():\n    s = time.perf_counter()\n    assert time.perf_counter() - s < 1.0\n"
        "def test_reversed():\n    s = time.monotonic()\n    assert 2 > time.monotonic() - s\n"
        "def test_cpu():\n    s = time.process_time()\n    assert time.process_time() - s < 1\n"
        "def test_named():\n    t = time.time()\n    took = time.time() - t\n    assert took <= 3\n"
        "def test_lower_bound_only():\n    s = time.time()\n    assert time.time() - s > 0.1\n"
        "@pytest.mark.serial\n"
        "def test_marked():\n    s = time.perf_counter()\n    assert time.perf_counter() - s < 1\n"
    )
    assert unserial_wall_clock_tests(tmp_path / "m.py", tmp_path) == [
        "m.py::test_wall",
        "m.py::test_reversed",
        "m.py::test_named",
    ]


def test_every_test_that_bounds_wall_time_runs_serially():
    found = []
    for path in sorted(ROOT.rglob("test_*.py")):
        if "__pycache__" not in path.parts:
            found += unserial_wall_clock_tests(path)
    assert found == []
