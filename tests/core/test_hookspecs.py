"""Each hook, end to end: a plugin implementing it is called with the documented arguments.

``tests/test_plugin_hooks_docs.py`` checks that every hook has a test here
named ``test_hook_<hook name>``.
"""

from __future__ import annotations

import types

import pytest

from rlax.core import hookimpl, hookspecs
from rlax.core.errors import PluginLoadError
from rlax.core.plugins import KINDS, PluginManager, build_plugin_manager


class Thing:
    def __init__(self, *, size: int = 1):
        self.size = size


def registered(hook_name: str) -> PluginManager:
    plugin = types.SimpleNamespace(**{hook_name: hookimpl(lambda: {"thing": Thing})})
    return build_plugin_manager(autoload=False, builtins=False, extra=[plugin])


def assert_fills_only(kind: str, hook_name: str) -> None:
    """A plugin implementing ``hook_name`` registers a component of ``kind`` and nothing else."""
    pm = registered(hook_name)

    assert KINDS[kind] == hook_name
    assert pm.get(kind, "thing").factory is Thing
    assert pm.get(kind, "thing").kind == kind
    assert {k: pm.names(k) for k in KINDS} == {k: ["thing"] if k == kind else [] for k in KINDS}


def test_hook_rlax_register_algorithms():
    assert_fills_only("algorithms", "rlax_register_algorithms")


def test_hook_rlax_register_rewards():
    assert_fills_only("rewards", "rlax_register_rewards")


def test_hook_rlax_register_samplers():
    assert_fills_only("samplers", "rlax_register_samplers")


def test_hook_rlax_register_curation_filters():
    assert_fills_only("curation", "rlax_register_curation_filters")


def test_hook_rlax_register_tasks():
    assert_fills_only("tasks", "rlax_register_tasks")


def test_hook_rlax_register_loggers():
    assert_fills_only("loggers", "rlax_register_loggers")


def test_hook_rlax_register_environments():
    assert_fills_only("environments", "rlax_register_environments")


def test_hook_rlax_register_agents():
    assert_fills_only("agents", "rlax_register_agents")


def test_hook_rlax_register_tool_parsers():
    assert_fills_only("tool_parsers", "rlax_register_tool_parsers")


def recording_manager(**impls: tuple[str, ...]) -> tuple[PluginManager, list]:
    """Two plugins implementing the given hooks (with those parameters), recording calls."""
    calls: list = []
    pm = PluginManager()
    for tag in ("first", "second"):
        plugin = types.SimpleNamespace(
            **{
                name: hookimpl(_recorder(calls, tag, name, params))
                for name, params in impls.items()
            }
        )
        pm.register(plugin, name=tag)
    pm.load(autoload=False, builtins=False)
    return pm, calls


def _recorder(calls: list, tag: str, name: str, params: tuple[str, ...]):
    namespace: dict = {}
    args = ", ".join(params)
    exec(  # noqa: S102 -- a function with exactly the hook's parameter names
        f"def impl({args}):\n    calls.append((tag, name, dict(zip({params!r}, [{args}]))))\n",
        {"calls": calls, "tag": tag, "name": name},
        namespace,
    )
    return namespace["impl"]


def test_hook_rlax_on_step_end():
    pm, calls = recording_manager(rlax_on_step_end=("step", "metrics"))

    pm.hook.rlax_on_step_end(step=3, metrics={"loss": 0.25})

    assert sorted(calls) == [
        ("first", "rlax_on_step_end", {"step": 3, "metrics": {"loss": 0.25}}),
        ("second", "rlax_on_step_end", {"step": 3, "metrics": {"loss": 0.25}}),
    ]


def test_hook_rlax_on_weights_published():
    pm, calls = recording_manager(rlax_on_weights_published=("version",))

    pm.hook.rlax_on_weights_published(version=12)

    assert sorted(calls) == [
        ("first", "rlax_on_weights_published", {"version": 12}),
        ("second", "rlax_on_weights_published", {"version": 12}),
    ]


def test_hook_rlax_on_checkpoint():
    pm, calls = recording_manager(rlax_on_checkpoint=("path",))  # a subset of the arguments

    pm.hook.rlax_on_checkpoint(step=40, path="/ckpt/40")

    assert sorted(calls) == [
        ("first", "rlax_on_checkpoint", {"path": "/ckpt/40"}),
        ("second", "rlax_on_checkpoint", {"path": "/ckpt/40"}),
    ]


def test_hook_rlax_on_preemption():
    pm, calls = recording_manager(rlax_on_preemption=("role", "reason"))

    pm.hook.rlax_on_preemption(role="worker", reason="SIGTERM")

    assert sorted(calls) == [
        ("first", "rlax_on_preemption", {"role": "worker", "reason": "SIGTERM"}),
        ("second", "rlax_on_preemption", {"role": "worker", "reason": "SIGTERM"}),
    ]


def test_an_argument_the_hook_does_not_have_is_rejected():
    plugin = types.SimpleNamespace(rlax_on_step_end=hookimpl(_recorder([], "x", "y", ("stepp",))))

    with pytest.raises(PluginLoadError, match="stepp"):
        build_plugin_manager(autoload=False, builtins=False, extra=[plugin])


def test_no_hook_is_firstresult_or_historic():
    pm = PluginManager()
    for name in hook_names():
        opts = pm.parse_hookspec_opts(hookspecs, name)
        assert not opts.get("firstresult") and not opts.get("historic"), name


def hook_names() -> list[str]:
    return [name for name in vars(hookspecs) if name.startswith("rlax_")]


def test_every_hook_name_is_rlax_verb_noun():
    assert all(name.count("_") >= 2 for name in hook_names())
    assert {name.split("_")[1] for name in hook_names()} == {"register", "on"}
