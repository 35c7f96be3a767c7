"""The plugin manager: discovery, switches, registries, errors and gin names."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import gin
import pytest

from rlax.core import config, hookimpl
from rlax.core.errors import DuplicatePluginError, PluginError, PluginLoadError, UnknownPluginError
from rlax.core.plugins import (
    AUTOLOAD_ENV,
    Component,
    PluginManager,
    build_plugin_manager,
    installed_entry_points,
    is_builtin,
)


def test_entry_point_is_discovered_with_its_distribution(site):
    site.install("rlax-fake", "1.2", {"fake_rewards": site.rewards("loud")})

    pm = build_plugin_manager()

    component = pm.get("rewards", "loud")
    assert (component.plugin, component.distribution, component.version) == (
        "fake_rewards",
        "rlax-fake",
        "1.2",
    )
    assert component.factory is sys.modules["fake_rewards"].Reward
    assert component.factory(weight=2.0).score(None, "abc") == 6.0


def test_components_are_listed_sorted_by_kind_then_name(site):
    site.install("rlax-fake", "1.0", {"fake_many": site.rewards("b", "a")})
    algorithms = types.SimpleNamespace(
        rlax_register_algorithms=hookimpl(lambda: {"zz": dict, "aa": list})
    )

    pm = build_plugin_manager(extra=[algorithms])

    listed = [(c.kind, c.name) for c in pm.components()]
    assert listed == [
        ("algorithms", "aa"),
        ("algorithms", "zz"),
        ("rewards", "a"),
        ("rewards", "b"),
    ]


def test_disable_autoload_env_skips_entry_points(site, monkeypatch):
    site.install("rlax-fake", "1.0", {"fake_auto": site.rewards("auto")})
    monkeypatch.setenv(AUTOLOAD_ENV, "1")

    pm = build_plugin_manager()

    assert pm.names("rewards") == []
    assert pm.get_plugin("fake_auto") is None


def test_disable_autoload_still_loads_an_entry_point_named_explicitly(site, monkeypatch):
    site.install(
        "rlax-fake", "1.0", {"fake_one": site.rewards("one"), "fake_two": site.rewards("two")}
    )
    monkeypatch.setenv(AUTOLOAD_ENV, "1")

    pm = build_plugin_manager(extra=["fake_two"])

    assert pm.names("rewards") == ["two"]
    assert pm.get("rewards", "two").distribution == "rlax-fake"


def test_disable_autoload_env_keeps_the_builtins(site, monkeypatch):
    # Built-ins are the entry points of rlax's own distribution (as pytest's are its own).
    site.install("rlax-llm", "0.1", {"fake_builtin": site.rewards("builtin")})
    site.install("rlax-fake", "1.0", {"fake_third": site.rewards("third")})
    monkeypatch.setenv(AUTOLOAD_ENV, "1")

    pm = build_plugin_manager()

    assert pm.names("rewards") == ["builtin"]
    assert pm.get("rewards", "builtin").distribution == "rlax-llm"
    assert "fake_third" not in sys.modules
    assert not pm.autoloaded


def test_without_the_env_builtins_and_third_party_plugins_load(site):
    site.install("rlax-llm", "0.1", {"fake_builtin": site.rewards("builtin")})
    site.install("rlax-fake", "1.0", {"fake_third": site.rewards("third")})

    pm = build_plugin_manager()

    assert pm.names("rewards") == ["builtin", "third"]
    assert pm.autoloaded


def test_a_builtin_can_still_be_blocked_by_name(site, monkeypatch):
    site.install("rlax-llm", "0.1", {"fake_builtin": site.rewards("builtin")})
    monkeypatch.setenv(AUTOLOAD_ENV, "1")

    pm = build_plugin_manager(disabled=["fake_builtin"])

    assert pm.names("rewards") == []


def test_builtins_false_loads_no_entry_point(site):
    site.install("rlax-llm", "0.1", {"fake_builtin": site.rewards("builtin")})
    site.install("rlax-fake", "1.0", {"fake_third": site.rewards("third")})

    pm = build_plugin_manager(autoload=False, builtins=False)

    assert pm.names("rewards") == []
    assert "fake_builtin" not in sys.modules and "fake_third" not in sys.modules


def test_the_builtin_distribution_name_is_compared_normalised(site):
    site.install("rlax_llm", "0.1", {"fake_underscored": site.rewards("underscored")})

    (entry_point,) = site.entry_points()

    assert is_builtin(entry_point)


def test_disabled_plugin_is_not_even_imported(site):
    site.install("rlax-fake", "1.0", {"fake_broken": "raise RuntimeError('imported!')"})
    site.install("rlax-good", "1.0", {"fake_good": site.rewards("good")})

    pm = build_plugin_manager(disabled=["fake_broken"])

    assert pm.names("rewards") == ["good"]
    assert "fake_broken" not in sys.modules


def test_module_named_explicitly_is_loaded_without_a_distribution(site):
    module = site.module("fake_local_module", site.rewards("local"))

    pm = build_plugin_manager(extra=[module])

    component = pm.get("rewards", "local")
    assert (component.plugin, component.distribution, component.version) == (module, "-", "-")


def test_failing_entry_point_names_entry_point_and_distribution(site):
    site.install("rlax-fake", "3.1", {"fake_missing": "import no_such_module_rlax_test"})

    with pytest.raises(PluginLoadError) as info:
        build_plugin_manager()

    message = str(info.value)
    assert "'fake_missing'" in message
    assert "rlax-fake 3.1" in message
    assert "ModuleNotFoundError" in message


def test_entry_point_without_hooks_is_an_error(site):
    site.install("rlax-fake", "1.0", {"fake_empty": "X = 1\n"})

    with pytest.raises(PluginLoadError, match="'fake_empty'.*implements no rlax hook"):
        build_plugin_manager()


def test_unknown_hook_name_is_an_error(site):
    site.install(
        "rlax-fake",
        "1.0",
        {
            "fake_typo": """
                from rlax.core import hookimpl

                @hookimpl
                def rlax_register_reward():
                    return {}
            """
        },
    )

    with pytest.raises(PluginLoadError, match="rlax_register_reward"):
        build_plugin_manager()


def test_missing_module_named_with_p_is_an_error(site):
    with pytest.raises(PluginLoadError, match="'no_such_module_rlax_test'"):
        build_plugin_manager(extra=["no_such_module_rlax_test"])


def test_duplicate_component_names_both_sources(site):
    site.install("rlax-a", "1.0", {"plugin_a": site.rewards("same", cls="A")})
    site.install("rlax-b", "2.0", {"plugin_b": site.rewards("same", cls="B")})

    with pytest.raises(DuplicatePluginError) as info:
        build_plugin_manager()

    message = str(info.value)
    assert "rewards name 'same'" in message
    assert "plugin 'plugin_a' from rlax-a 1.0" in message
    assert "plugin 'plugin_b' from rlax-b 2.0" in message


def test_duplicate_with_a_plugin_without_distribution(site):
    site.install("rlax-a", "1.0", {"plugin_a": site.rewards("same")})
    local = site.module("local_same", site.rewards("same"))

    with pytest.raises(DuplicatePluginError) as info:
        build_plugin_manager(extra=[local])

    assert "plugin 'plugin_a' from rlax-a 1.0" in str(info.value)
    assert "plugin 'local_same' (no distribution)" in str(info.value)


def test_same_plugin_name_in_two_distributions_is_an_error(site):
    site.install("rlax-a", "1.0", {"mod_a": site.rewards("ra")}, ep_name="clash")
    site.install("rlax-b", "2.0", {"mod_b": site.rewards("rb")}, ep_name="clash")

    with pytest.raises(DuplicatePluginError) as info:
        build_plugin_manager()

    message = str(info.value)
    assert "plugin name 'clash'" in message
    assert "rlax-a 1.0" in message and "rlax-b 2.0" in message


def test_same_name_in_different_kinds_is_fine(site):
    both = types.SimpleNamespace(
        rlax_register_rewards=hookimpl(lambda: {"arith": dict}),
        rlax_register_tasks=hookimpl(lambda: {"arith": list}),
    )

    pm = build_plugin_manager(extra=[both])

    assert pm.get("rewards", "arith").factory is dict
    assert pm.get("tasks", "arith").factory is list


def test_unknown_name_lists_the_valid_names_sorted(site):
    site.install("rlax-fake", "1.0", {"fake_three": site.rewards("zeta", "alpha", "mid")})
    pm = build_plugin_manager()

    with pytest.raises(UnknownPluginError) as info:
        pm.get("rewards", "nope")

    assert str(info.value) == "unknown rewards plugin 'nope'; valid rewards: alpha, mid, zeta"


def test_unknown_kind_lists_the_valid_kinds(site):
    pm = build_plugin_manager()

    with pytest.raises(UnknownPluginError) as info:
        pm.get("reward", "x")

    assert str(info.value) == (
        "unknown plugin kind 'reward'; valid kinds: agents, algorithms, critics, curation, "
        "environments, loggers, rewards, samplers, tasks, tool_parsers, weight_lanes"
    )


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (["x"], "must return a dict"),
        ({"my-reward": dict}, "not a Python identifier"),
        ({"fine": 3}, "'fine' is not callable"),
    ],
)
def test_malformed_registration_is_an_error(site, result, match):
    plugin = types.SimpleNamespace(rlax_register_rewards=hookimpl(lambda: result))

    with pytest.raises(PluginError, match=match):
        build_plugin_manager(extra=[plugin])


def test_registries_need_load_and_load_runs_once(site):
    pm = PluginManager()
    with pytest.raises(RuntimeError, match="load"):
        pm.names("rewards")
    pm.load()
    with pytest.raises(RuntimeError, match="already loaded"):
        pm.load()


def test_component_is_a_frozen_record():
    component = Component("rewards", "x", dict, "p")

    assert (component.distribution, component.version) == ("-", "-")
    with pytest.raises(AttributeError):
        component.name = "y"  # type: ignore[misc]


# -- gin ------------------------------------------------------------------


def test_components_become_gin_configurables_under_their_kind(site):
    site.install("rlax-fake", "1.0", {"fake_gin": site.rewards("weighted")})
    build_plugin_manager()

    gin.clear_config()
    gin.parse_config("rewards.weighted.weight = 0.25")
    reward = config.configured("rewards", "weighted")()

    assert reward.score(None, "abcd") == 1.0
    gin.clear_config()


def test_new_manager_replaces_gin_entries_of_its_kinds(site):
    site.install("rlax-a", "1.0", {"gin_first": site.rewards("kept", "dropped", cls="First")})
    build_plugin_manager()
    first = sys.modules["gin_first"].First
    second = types.SimpleNamespace(rlax_register_rewards=hookimpl(lambda: {"kept": list}))

    build_plugin_manager(autoload=False, builtins=False, extra=[second])

    gin.clear_config()
    assert config.configured("rewards", "kept")() == []  # the new factory, not First
    assert not isinstance(config.configured("rewards", "kept")(), first)
    with pytest.raises(ValueError, match="No configurable matching 'rewards.dropped'"):
        gin.parse_config("rewards.dropped.weight = 1.0")
    gin.clear_config()


# -- the built-ins ------------------------------------------------------------

BUILTINS = {
    ("algorithms", "grpo"),
    ("rewards", "arithmetic"),
    ("samplers", "jax"),
    ("tasks", "arithmetic"),
    ("curation", "zero_variance"),
}


def test_builtin_plugins_load_through_their_entry_points(monkeypatch):
    entry_points = {ep.name: ep.value for ep in installed_entry_points()}
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)

    pm = build_plugin_manager()

    listed = {(c.kind, c.name): c for c in pm.components()}
    assert BUILTINS <= set(listed)
    for key in BUILTINS:
        assert listed[key].plugin in entry_points
        assert listed[key].distribution == "rlax-llm"


# -- no import-time side effects -------------------------------------------


def test_importing_the_core_loads_no_plugin():
    code = (
        "import sys, rlax.core.plugins, rlax.core.cli, rlax.core.config\n"
        "print(sorted(m for m in sys.modules if m.startswith('rlax.plugins.')))"
    )
    env = {**os.environ, AUTOLOAD_ENV: ""}

    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout

    assert out.strip() == "[]"
