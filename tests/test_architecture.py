"""The house rules of docs/architecture.md, checked on the source tree.

- The import graph of ``rlax.core`` and ``rlax.plugins`` has no cycle, counting
  the imports inside functions too (a lazy import is how a cycle hides);
  imports under ``if TYPE_CHECKING:`` are for annotations only and do not count.
- No module under ``core/`` imports ``rlax.plugins``: the core knows plugins
  only through the contracts (``core/contracts.py``) and the plugin manager.
- Every module belongs to a layer (:data:`LAYERS`) and imports only from its own
  layer or the ones below it, in functions too (``TYPE_CHECKING`` imports excepted).
- Sizes are a guide and a cap (generated protobuf code excepted): a module past
  400 lines or a function past 60 is reported (one :class:`SizeGuideWarning`
  naming each, in the warnings summary: look there for a split by meaning, not
  for lines to save); past 500 lines or 80 the test fails.
- No module imports a package that only the ``hf`` extra installs (torch,
  transformers, accelerate, peft): they are for parity tests, not a dependency,
  and the type check skips them (pyproject.toml), so an import would go unchecked.
- Every path the "where is X" table of docs/architecture.md names exists, and the
  folder table names every module of each folder it lists, and no other.
- No module but ``core/runtime/run_dir.py`` writes the name of a file or folder of a
  run (every name ``RunDir.names()`` lists) as a path: :func:`run_file_literals`.
- The supervisor of ``rlax run`` and the parameter server never import JAX (nor flax,
  optax, orbax): a fresh process that loads the built-in plugins, parses packaged
  configs, builds their specifications and checks them as those two roles do, with
  their entry modules imported, has none of them in ``sys.modules``
  (:mod:`rlax.core.runtime.jax_free`; the whole-run record is test_local_cluster's).
- No Python file of the project (package, tests, benchmarks, examples) turns the
  formatter off (``fmt: skip`` / ``fmt: off``, black's and ruff's pragmas): a layout
  the formatter would change is one the next reader has to keep by hand.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence

import pytest

from rlax.core.runtime.run_dir import RunDir

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"rlax.core": ROOT / "core", "rlax.plugins": ROOT / "plugins"}
GENERATED = {"rlax_pb2.py", "rlax_pb2_grpc.py"}
MODULE_GUIDE, FUNCTION_GUIDE = 400, 60  # past these: reported
MODULE_CAP, FUNCTION_CAP = 500, 80  # past these: the test fails


def modules() -> dict[str, pathlib.Path]:
    """``{dotted name: file}`` of every module of the two packages."""
    found = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join([package, *parts])
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:``."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for inner in node.body:
                lines.update(range(inner.lineno, inner.end_lineno + 1))
    return lines


def imported(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The rlax modules ``path`` imports anywhere in its body (module level or in functions)."""

    def owner(name: str) -> str | None:  # the module (or package) a dotted name lives in
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    names = imported_names(path, type_checking=False)
    return {m for m in map(owner, (n for n in names if n.startswith("rlax."))) if m}


def imported_names(path: pathlib.Path, *, type_checking: bool = True) -> set[str]:
    """Every absolute name ``path`` imports (``a.b`` for ``import a.b``, ``a.b`` for
    ``from a import b``), in functions too; ``type_checking=False`` leaves out those under
    ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = set() if type_checking else _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {name: imported(path, known) for name, path in known.items()}
    return {name: deps - {name} for name, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_lazy_import_counts_and_a_type_checking_one_does_not(tmp_path):
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rlax.core import types\n"
        "def f():\n    from rlax.core.errors import ConfigError\n"
    )
    known = {"rlax.core.types": pathlib.Path(), "rlax.core.errors": pathlib.Path()}
    assert imported(tmp_path / "m.py", known) == {"rlax.core.errors"}


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 80  # the walk found the tree
    assert cycles(graph) == []


# Bottom first. A module is in the layer of the longest prefix that names it (a prefix
# names itself and what is under it); the root package itself (the hook markers) is base.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "rlax.core.types",
            "rlax.core.errors",
            "rlax.core.constraints",
            "rlax.core.episodes",
            "rlax.core.filters",
            "rlax.core.weight_lane",
            "rlax.core.critic",
            "rlax.core.contracts",
            "rlax.core.hookspecs",
            "rlax.core.plugins",
            "rlax.core.configurables",
            "rlax.core.gin_state",
            "rlax.core.masked",
            "rlax.core.wire",
        ),
    ),
    ("models", ("rlax.core.models", "rlax.core.parallel", "rlax.core.runtime")),
    ("rollout", ("rlax.core.rollout",)),
    ("plugins", ("rlax.plugins",)),
    ("services", ("rlax.core.param_server", "rlax.core.evaluation")),
    ("roles", ("rlax.core.worker", "rlax.core.trainer")),
    ("spec", ("rlax.core.spec",)),
    ("launch", ("rlax.core.launch",)),
    ("config", ("rlax.core.config",)),
    ("cli", ("rlax.core.cli",)),
)
ROOT_PACKAGE = "rlax.core"


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module``'s layer (None: in no layer)."""
    if module == ROOT_PACKAGE:
        return 0
    best: tuple[int, int] | None = None  # (length of the prefix, layer)
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best or (0, 0), (len(prefix), i))
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``"a (layer) -> b (layer)"`` for every import of a module in a higher layer."""
    found = []
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            low, high = layer_of(name), layer_of(dep)
            if low is not None and high is not None and high > low:
                found.append(f"{name} ({LAYERS[low][0]}) -> {dep} ({LAYERS[high][0]})")
    return found


def test_a_module_is_in_its_longest_prefix_layer_and_an_upward_import_is_found():
    assert LAYERS[layer_of("rlax.core")][0] == "base"
    assert LAYERS[layer_of("rlax.core.param_server.queue.state")][0] == "services"
    assert LAYERS[layer_of("rlax.core.cli")][0] == "cli"
    assert layer_of("rlax.elsewhere") is None
    assert layer_of("rlax.core.new_root_module") is None  # a new module must be placed
    graph = {
        "rlax.core.wire": {"rlax.core.trainer.step"},
        "rlax.core.trainer.step": {"rlax.core.wire"},
    }
    assert upward_imports(graph) == ["rlax.core.wire (base) -> rlax.core.trainer.step (roles)"]


def test_every_module_is_in_a_layer_and_no_import_runs_up_a_layer():
    graph = import_graph()
    assert [name for name in graph if layer_of(name) is None] == []
    assert upward_imports(graph) == []


def test_the_core_never_imports_a_plugin():
    graph = import_graph()
    offenders = {
        name: sorted(d for d in deps if d.startswith("rlax.plugins"))
        for name, deps in graph.items()
        if name.startswith("rlax.core")
    }
    assert {name: deps for name, deps in offenders.items() if deps} == {}


TEST_ONLY = {"torch", "transformers", "accelerate", "peft"}  # the hf extra


def top_level_imports(path: pathlib.Path) -> set[str]:
    """The package of every absolute import in ``path``, in functions and under
    ``if TYPE_CHECKING:`` too (the type check follows those)."""
    return {name.partition(".")[0] for name in imported_names(path)}


def test_the_import_walk_sees_imports_in_functions_and_for_types(tmp_path):
    (tmp_path / "m.py").write_text(
        "import os.path\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import peft\ndef f():\n    from torch import nn\n"
    )
    assert top_level_imports(tmp_path / "m.py") == {"os", "typing", "peft", "torch"}


def test_no_module_imports_a_test_only_package():
    offenders = {
        name: sorted(top_level_imports(path) & TEST_ONLY) for name, path in modules().items()
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def _sources() -> list[pathlib.Path]:
    return [p for p in modules().values() if p.name not in GENERATED]


class SizeGuideWarning(UserWarning):
    """Modules or functions past the size guide, not past the cap: where to look for a split."""


def oversized(text: str, module_lines: int, function_lines: int) -> list[str]:
    """``"N lines"`` if the module ``text`` is over ``module_lines``, then ``"NAME (N lines)"``
    for each function (nested ones too) over ``function_lines``."""
    lines = text.count("\n")
    found = [f"{lines} lines"] if lines > module_lines else []
    for node in ast.walk(ast.parse(text)):
        size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and size > function_lines:
            found.append(f"{node.name} ({size} lines)")
    return found


def report_past_the_guide(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """``{name: what is past the guide}`` of ``sources`` (name -> text), warned as one
    :class:`SizeGuideWarning` listing each (nothing warned when none is)."""
    report = {
        name: found
        for name, text in sources.items()
        if (found := oversized(text, MODULE_GUIDE, FUNCTION_GUIDE))
    }
    if report:
        lines = [f"  {name}: {', '.join(found)}" for name, found in sorted(report.items())]
        warnings.warn(
            SizeGuideWarning(
                f"{len(report)} modules past the guide ({MODULE_GUIDE} lines, functions "
                f"{FUNCTION_GUIDE}); a split by meaning, if they hold more than one job:\n"
                + "\n".join(lines)
            ),
            stacklevel=2,
        )
    return report


def _function(name: str, lines: int) -> str:
    """A function of exactly ``lines`` lines (its ``def`` line, then one statement a line)."""
    return f"def {name}():\n" + "    x = 1\n" * (lines - 1)


def test_past_the_guide_is_reported_and_only_past_the_cap_fails():
    # 451 lines: a 70-line function, a 61-line one, a 60-line one and 260 lines of statements.
    text = _function("long", 70) + _function("just_over", 61) + _function("at_guide", 60)
    text += "y = 2\n" * 260
    assert text.count("\n") == 451
    assert oversized(text, MODULE_GUIDE, FUNCTION_GUIDE) == [
        "451 lines",
        "long (70 lines)",
        "just_over (61 lines)",
    ]
    assert oversized(text, MODULE_CAP, FUNCTION_CAP) == []  # past the guide, within the cap
    assert oversized(_function("huge", 81), MODULE_CAP, FUNCTION_CAP) == ["huge (81 lines)"]
    assert oversized("z = 3\n" * 501, MODULE_CAP, FUNCTION_CAP) == ["501 lines"]

    with pytest.warns(SizeGuideWarning, match=r"(?s)1 modules past.*big: 451 lines, long \(70"):
        assert report_past_the_guide({"big": text, "small": _function("f", 60)}) == {
            "big": ["451 lines", "long (70 lines)", "just_over (61 lines)"]
        }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing past the guide: nothing warned
        assert report_past_the_guide({"small": _function("f", 60)}) == {}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_500_lines_and_no_function_over_80(path):
    assert oversized(path.read_text(), MODULE_CAP, FUNCTION_CAP) == []


def test_modules_and_functions_past_the_guide_are_reported():
    """The tree's report (a warning in the summary; ``-W error::SizeGuideWarning`` to stop)."""
    sources = {str(path.relative_to(ROOT)): path.read_text() for path in _sources()}
    report = report_past_the_guide(sources)
    assert set(report) <= set(sources)


def test_every_path_in_the_where_is_table_exists():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("## Where is X", 1)[1].split("\n## ", 1)[0]
    refs = re.findall(r"`((?:core|plugins)/[\w/]+\.py)::([\w.]+)`", table)
    assert len(refs) >= 10  # the table names the class or function, not just a file
    for path, name in refs:
        assert (ROOT / path).is_file(), path
        source = (ROOT / path).read_text()
        top, _, member = name.partition(".")
        assert re.search(rf"^(class {top}\b|def {top}\b|{top}\b.*=)", source, re.MULTILINE), (
            path,
            top,
        )
        if member:
            assert re.search(rf"^    def {member}\b", source, re.MULTILINE), (path, name)


def test_the_folder_table_names_every_module_of_each_folder():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("## One folder per layer, role or concern", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(core/[\w/]+)/` \| (.*) \|$", table, re.MULTILINE)
    listed = {folder for folder, _ in rows}
    on_disk = {
        p.parent.relative_to(ROOT).as_posix()
        for p in (ROOT / "core").rglob("__init__.py")
        if "__pycache__" not in p.parts and p.parent != ROOT / "core"
    }
    assert listed == on_disk
    for folder, text in rows:
        named = set(re.findall(r"\(`(\w+)`|`(\w+)`", text))
        named = {a or b for a, b in named} - {"__init__"}
        present = {
            p.stem if p.is_file() else p.name
            for p in (ROOT / folder).iterdir()
            if (p.suffix == ".py" and p.stem != "__init__" and p.name not in GENERATED)
            or (p.is_dir() and (p / "__init__.py").is_file())
        }
        assert named == present, folder


# -- the run directory's names are RunDir's alone ----------------------------------------

RUN_DIR_MODULE = ROOT / "core" / "runtime" / "run_dir.py"
#: Calls whose string arguments are paths (``pathlib.Path("x")``, ``os.path.join(a, "x")``...).
PATH_CALLS = {"Path", "PurePath", "PosixPath", "joinpath", "join", "open", "with_name"}


def _as_path(node: ast.Constant, parent: dict[ast.AST, ast.AST]) -> bool:
    """Whether the string ``node`` stands where a path (or a path's name) is made: an operand
    of ``/``, an argument of a :data:`PATH_CALLS` call, the value of an assignment (a
    named constant), or an item of a literal a loop or comprehension runs over."""
    up = parent.get(node)
    if isinstance(up, ast.BinOp):
        return isinstance(up.op, ast.Div)
    if isinstance(up, ast.Call):
        func = up.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return node in up.args and name in PATH_CALLS
    if isinstance(up, ast.Assign | ast.AnnAssign):
        return up.value is node
    if isinstance(up, ast.Tuple | ast.List | ast.Set):
        loop = parent.get(up)
        return isinstance(loop, ast.For | ast.comprehension) and loop.iter is up
    return False


def _in_a_written_path(text: str, names: Sequence[str]) -> bool:
    """Whether ``text`` has one of ``names`` right after or before a ``/``."""
    return any(
        re.search(rf"/{re.escape(n)}(?![\w.])|(?<![\w.]){re.escape(n)}/", text) for n in names
    )


def run_file_literals(path: pathlib.Path, names: Sequence[str]) -> list[str]:
    """``"LINE: 'text'"`` for each string literal of ``path`` that writes one of ``names``:
    the whole literal where a path is made (:func:`_as_path`), or anywhere as a part of a
    path written out (``"RUN/eval.json"``, ``f"{run}/eval.json"``, ``"train_state/"``). Docstrings and
    other bare strings are documentation and do not count; nor does the same word with
    another meaning (the ``"checkpoint"`` phase, the ``"param_server"`` role)."""
    tree = ast.parse(path.read_text())
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if isinstance(parent.get(node), ast.Expr):  # a docstring
            continue
        if _in_a_written_path(node.value, names) or (
            node.value in names and _as_path(node, parent)
        ):
            found.append((node.lineno, node.col_offset, f"{node.lineno}: {node.value!r}"))
    return [text for *_, text in sorted(found)]


def test_the_run_file_rule_finds_a_name_written_as_a_path_and_only_then(tmp_path):
    (tmp_path / "m.py").write_text(
        '"""RUN/eval.json: a docstring documents it."""\n'
        'FILE = "eval.json"\n'
        'a = run / "eval.json"\n'
        'b = pathlib.Path(run, "train_state")\n'
        'c = f"{run}/train_state/0"\n'
        'f = "no train_state/ here"\n'
        'g = "the train_state of it is prose"\n'
        'd = [run / n for n in ("checkpoint", "x")]\n'
        'clock("checkpoint")\n'
        'PHASES = ("train", "checkpoint")\n'
        'start(role="param_server")\n'
        'e = {"checkpoint": str(path)}\n'
    )
    assert run_file_literals(tmp_path / "m.py", ["eval.json", "train_state", "checkpoint"]) == [
        "2: 'eval.json'",
        "3: 'eval.json'",
        "4: 'train_state'",
        "5: '/train_state/0'",
        "6: 'no train_state/ here'",
        "8: 'checkpoint'",
    ]


def test_no_module_but_run_dir_writes_a_run_file_name():
    names = RunDir.names()
    assert {"operative_config.gin", "eval.json", "checkpoint", "param_server"} <= set(names)
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in _sources()
        if path != RUN_DIR_MODULE and (found := run_file_literals(path, names))
    }
    assert offenders == {}


# -- gin's private state is read in one module -------------------------------------------

GIN_ADAPTER = ROOT / "core" / "gin_state.py"
GIN_SCANNED = ("core", "plugins", "tests", "scripts", "benchmarks")
#: A private attribute of ``gin.config`` (by dot or ``getattr``) and gin's private names on
#: their own (``OPERATIVE_CONFIG`` is another name: the underscore must start the word).
GIN_PRIVATE = re.compile(
    r"\bgin\.config\._|getattr\(\s*gin\.config\s*,\s*[\"']_|\b_(?:REGISTRY|CONFIG|FILE_READERS)\b"
)


def gin_private_reads(text: str) -> list[int]:
    """The numbers of the lines of ``text`` that name gin's private state."""
    return [n for n, line in enumerate(text.splitlines(), 1) if GIN_PRIVATE.search(line)]


def test_the_gin_private_state_finder_finds_each_form_and_only_those():
    private = "gin.config." + "_"  # spelled apart, so this file does not name it
    text = (
        f"a = {private}REGISTRY.get(s)\n"
        f"b = list({private}FILE_READERS)\n"
        f'c = getattr(gin.config, "{private[-1]}CONFIG", None)\n'
        f"from gin.config import {private[-1]}CONFIG\n"
        "d = run_dir.OPERATIVE_CONFIG + TRAINER_CONFIG\n"
        "e = gin.config.ParsedBindingKey.parse(key)\n"
        "f = gin.query_parameter('rlax.train.steps')\n"
    )
    assert gin_private_reads(text) == [1, 2, 3, 4]


def test_only_the_gin_adapter_reads_gin_private_state():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in GIN_SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != GIN_ADAPTER and "__pycache__" not in path.parts
        for line in gin_private_reads(path.read_text())
    ]
    assert offenders == []


# -- the supervisor and the parameter server import no JAX -------------------------------

#: What those two roles must never import (JAX, and what imports it).
JAX_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax")
#: Packaged experiments of every kind of sampler, algorithm and model: each is parsed, its
#: specification built and checked (a ``pypi:`` model's metadata is not fetched here).
JAX_FREE_CONFIGS = (
    "quickstart",
    "ppo",
    "dapo",
    "moe_quickstart",
    "multiturn_quickstart",
    "agents_quickstart",
    "smollm2_tools",
)
#: Run in a fresh interpreter: the front of ``rlax run`` as the supervisor and the
#: parameter server go through it, then the JAX packages it imported, as JSON, with the
#: stack of the first such import (so a failure names the chain to break).
JAX_FREE_SCRIPT = """
import importlib.abc, json, sys, traceback
HEAVY = set(sys.argv[1].split(","))
first = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY and not first:
            first.extend(str(f.filename) + ":" + str(f.lineno) for f in traceback.extract_stack()
                         if "rlax" in f.filename or "/core/" in f.filename or "/plugins/" in f.filename)
        return None
sys.meta_path.insert(0, Watch())
import rlax.core.cli, rlax.core.launch.local_cluster, rlax.core.param_server.role
from rlax.core import config
from rlax.core.plugins import build_plugin_manager
from rlax.core.spec.checks import check_run
pm = build_plugin_manager()
config.register_core_configurables()
for name in sys.argv[2:]:
    config.parse([name], [], plugins=pm)
    spec = config.build_spec(pm)
    if not str(spec.init_checkpoint).startswith("pypi:"):
        for role in ("all", "param_server"):
            check_run(spec, role)
found = sorted({m.split(".")[0] for m in sys.modules} & HEAVY)
print(json.dumps({"imported": found, "first": first}))
"""


def _imports_seen(packages: str, *configs: str) -> dict:
    """JAX_FREE_SCRIPT's verdict in a fresh process: which of ``packages`` were imported
    reading ``configs``, and the stack the first came from."""
    proc = subprocess.run(
        [sys.executable, "-c", JAX_FREE_SCRIPT, packages, *configs],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_supervisor_and_the_parameter_server_import_no_jax():
    found = _imports_seen(",".join(JAX_PACKAGES), *JAX_FREE_CONFIGS)
    assert found["imported"] == [], "\n".join(["first imported from:", *found["first"]])


def test_the_jax_free_check_sees_an_import_of_jax():
    """The same script, told to watch a package the front does import (gin), finds it
    and the stack it came from: the check above can fail."""
    found = _imports_seen("gin", "quickstart")
    assert found["imported"] == ["gin"]
    assert any("core/config" in frame for frame in found["first"])


FORMATTER_OFF = re.compile(r"#\s*fmt:\s*(skip|off)\b")
PROJECT_PYTHON = ("core", "plugins", "tests", "benchmarks", "examples")


def formatter_pragmas(text: str) -> list[int]:
    """Line numbers of ``text`` whose comment turns the formatter off."""
    return [i for i, line in enumerate(text.splitlines(), 1) if FORMATTER_OFF.search(line)]


def test_the_formatter_pragma_finder_finds_each_form_and_only_those():
    text = """x = [1,  2]  # FMT: skip
# FMT: off
y = 1  #FMT:skip
z = 2  # FMT: on
w = 'FMT: skip'
v = 3  # format: skip
""".replace("FMT", "fmt")  # spelled so that this file holds no pragma itself
    assert formatter_pragmas(text) == [1, 2, 3]  # not: on, a string, another word


def test_no_project_file_turns_the_formatter_off():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in PROJECT_PYTHON
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts and path.name not in GENERATED
        for line in formatter_pragmas(path.read_text())
    ]
    assert found == []
