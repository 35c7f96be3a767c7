"""Meta-tests (datasette's): every hook is documented, its example runs, and it is tested.

tests/test_docs.py checks what each example does.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import types

import gin
import pytest

from rlax.core import config, hookspecs
from rlax.core.plugins import KINDS, build_plugin_manager

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugin_hooks.md"

HOOKS = sorted(name for name in vars(hookspecs) if name.startswith("rlax_"))

# Arguments each lifecycle example is called with.
EXAMPLE_CALLS = {
    "rlax_on_step_end": {"step": 1, "metrics": {"loss": 0.5}},
    "rlax_on_weights_published": {"version": 1},
    "rlax_on_checkpoint": {"step": 40, "path": "runs/run/train_state/40"},
    "rlax_on_preemption": {"role": "worker", "reason": "SIGTERM"},
}


def signature(name: str) -> str:
    """``name(arg: type, ...) -> type`` from the hookspec's annotations."""
    sig = inspect.signature(getattr(hookspecs, name))
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


def sections() -> dict[str, str]:
    """Each ``### rlax_...`` heading's signature line -> the text up to the next heading."""
    parts = re.split(r"^### ", DOC.read_text(), flags=re.MULTILINE)[1:]
    return {part.splitlines()[0].strip(): part for part in parts}


def sections_of(name: str) -> str:
    (section,) = [text for heading, text in sections().items() if heading.startswith(name + "(")]
    return section


def example(name: str) -> str:
    section = sections_of(name)
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, f"{name}: expected one ```python example"
    return blocks[0]


def test_hooks_are_found():
    assert len(HOOKS) == 15


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_is_documented_with_its_exact_signature(name):
    assert signature(name) in sections()


def test_no_documented_hook_is_missing_from_the_hookspecs():
    assert sorted(heading.split("(")[0] for heading in sections()) == HOOKS


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_s_example_runs(name, capsys):
    plugin = types.ModuleType(f"docs_example_{name}")
    exec(compile(example(name), f"{DOC}:{name}", "exec"), plugin.__dict__)  # noqa: S102

    pm = build_plugin_manager(autoload=False, builtins=False, extra=[plugin])

    if name in EXAMPLE_CALLS:
        getattr(pm.hook, name)(**EXAMPLE_CALLS[name])
        assert capsys.readouterr().out.strip()
    else:
        # The section's "In gin:" line binds a parameter of a component the example
        # registers; the object gin builds has that value.
        (kind,) = [kind for kind, hook in KINDS.items() if hook == name]
        match = re.search(r"In gin: `(?P<binding>[\w.]+) = (?P<value>[^`]+)`", sections_of(name))
        assert match, f"{name}: no 'In gin:' binding"
        selector, _, param = match["binding"].rpartition(".")
        gin_kind, _, component = selector.partition(".")
        assert gin_kind == kind and component in pm.names(kind)
        config.parse([], [f"{match['binding']} = {match['value']}"], plugins=pm)
        built = config.configured(kind, component)()
        assert getattr(built, param) == ast.literal_eval(match["value"])
        gin.clear_config()


def test_every_hook_has_a_test():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    missing = [name for name in HOOKS if f"def test_hook_{name}(" not in tests]
    assert missing == []
