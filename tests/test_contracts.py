"""The contracts: every Protocol member is documented, listed in docs/plugin_hooks.md and real.

``core/contracts.py`` says what the core calls on each kind of component;
``docs/plugin_hooks.md`` lists the same members under the hook that registers
the kind; every built-in component satisfies its kind's Protocols; the core's
entry points are typed with them, and gin's type checks read those types.
"""

from __future__ import annotations

import inspect
import pathlib
import re
import typing
from collections.abc import Sequence

import gin
import pytest

from rlax.core import config, contracts, critic, episodes, filters, hookspecs, weight_lane
from rlax.core.config import bindings
from rlax.core.errors import ConfigError
from rlax.core.plugins import CONTRACTS, KINDS, build_plugin_manager

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugin_hooks.md"

# The Protocols of each component kind. The first is what every component of
# the kind must be; the others are optional capabilities (curation filters
# have at least one of OnlineFilter, OfflineFilter, Curriculum).
KIND_PROTOCOLS: dict[str, tuple[str, ...]] = {
    "algorithms": ("Algorithm", "BatchTerms", "Distils", "UsesEntropy"),
    "rewards": ("Reward",),
    "samplers": ("Sampler", "Resumable"),
    "tasks": ("Task", "Dataset"),
    "curation": ("OnlineFilter", "OfflineFilter", "Curriculum", "Refilling", "Stateful"),
    "loggers": ("Logger",),
    "environments": ("Environment",),
    "tool_parsers": ("ToolParser",),
    "weight_lanes": ("WeightLane", "HasServerHalf"),
    "critics": ("Critic",),
    "agents": (),  # any callable taking (client, prompt): no Protocol
}
# Protocols of what the core hands to components, or of its own parts: no plugin kind.
NOT_PLUGIN_KINDS = {
    "Encoder",
    "Tokenizer",
    "RolloutSource",
    "Episode",
    "LaneLink",
    "LaneHost",
    "ChecksRun",
}
# The modules whose Protocols are the contracts (rlax.core.contracts re-exports the others').
CONTRACT_MODULES = {
    contracts.__name__,
    critic.__name__,
    episodes.__name__,
    filters.__name__,
    weight_lane.__name__,
}
# A member a component may lack, and when it must have it.
CONDITIONAL = {("Algorithm", "value_model"): lambda component: component.needs_critic}


def protocols() -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(contracts).items()
        if inspect.isclass(obj)
        and obj.__module__ in CONTRACT_MODULES
        and getattr(obj, "_is_protocol", False)
    }


def members(protocol: type) -> list[str]:
    """Methods, properties and annotated attributes of ``protocol`` and its Protocol bases."""
    names: list[str] = []
    for cls in reversed(protocol.__mro__):
        if cls.__module__ not in CONTRACT_MODULES:
            continue
        for name in [*vars(cls), *vars(cls).get("__annotations__", {})]:
            if not name.startswith("_") and name not in names:
                names.append(name)
    return names


def is_documented(protocol: type, name: str) -> bool:
    """A method or property with a docstring, or an ``Attributes:`` entry of the class."""
    for cls in protocol.__mro__:
        if name in vars(cls) and cls.__module__ in CONTRACT_MODULES:
            member = vars(cls)[name]
            fn = member.fget if isinstance(member, property) else member
            if inspect.getdoc(fn):
                return True
    doc = inspect.getdoc(protocol) or ""
    attributes = doc.partition("Attributes:")[2]
    return re.search(rf"^\s+{re.escape(name)}:", attributes, flags=re.MULTILINE) is not None


def documented_members() -> dict[str, dict[str, list[str]]]:
    """{hook: {Protocol: [members]}} from each ``Members of `rlax.core.contracts.X``` list."""
    found: dict[str, dict[str, list[str]]] = {}
    for part in re.split(r"^### ", DOC.read_text(), flags=re.MULTILINE)[1:]:
        hook = part.split("(")[0]
        lists = re.findall(
            r"^Members of `rlax\.core\.contracts\.(\w+)`[^\n]*(?:\n(?!\n)[^\n]*)*\n\n"
            r"((?:- [^\n]*\n(?:  [^\n]*\n)*)+)",
            part,
            flags=re.MULTILINE,
        )
        for name, bullets in lists:
            found.setdefault(hook, {})[name] = re.findall(r"^- `(\w+)", bullets, re.MULTILINE)
    return found


# -- the Protocols and their documentation ----------------------------------------


def test_the_plugin_manager_knows_each_kind_s_protocols_as_listed_here():
    # The config's checks name the kind a Protocol-typed setting takes from CONTRACTS.
    assert CONTRACTS == KIND_PROTOCOLS and set(CONTRACTS) == set(KINDS)


def test_every_protocol_belongs_to_a_kind_or_is_named_as_none():
    kinds = {p for names in KIND_PROTOCOLS.values() for p in names}
    assert kinds <= set(protocols())
    assert set(protocols()) - kinds <= NOT_PLUGIN_KINDS
    assert {"Encoder", "Tokenizer"} <= set(protocols())


@pytest.mark.parametrize("name", sorted(protocols()))
def test_every_member_is_documented_in_the_contracts(name):
    protocol = protocols()[name]
    assert members(protocol), f"{name} has no members"
    assert [m for m in members(protocol) if not is_documented(protocol, m)] == []


def test_members_are_found_as_written():
    # Hand-listed: properties, methods and an inherited Protocol's members all count.
    assert members(contracts.Sampler) == [
        "setup",
        "load_weights",
        "generate",
        "temperature",
        "max_new_tokens",
    ]
    assert members(contracts.Tokenizer) == ["encode", "decode", "eos_id"]
    assert members(contracts.Refilling) == ["extra_rounds"]


@pytest.mark.parametrize("kind", sorted(KIND_PROTOCOLS))
def test_docs_list_exactly_the_members_of_each_kind_s_protocols(kind):
    listed = documented_members().get(KINDS[kind], {})
    assert sorted(listed) == sorted(KIND_PROTOCOLS[kind])
    for name, names in listed.items():
        assert names == members(protocols()[name]), f"docs/plugin_hooks.md, {name}"


@pytest.mark.parametrize("name", sorted(NOT_PLUGIN_KINDS))
def test_architecture_md_lists_exactly_the_members_of_the_core_s_own_protocols(name):
    """The Protocols that are no plugin kind are listed in docs/architecture.md instead."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    lists = dict(
        re.findall(
            r"^Members of `rlax\.core\.contracts\.(\w+)`[^\n]*(?:\n(?!\n)[^\n]*)*\n\n"
            r"((?:- [^\n]*\n)+)",
            text,
            flags=re.MULTILINE,
        )
    )
    assert sorted(lists) == sorted(NOT_PLUGIN_KINDS)
    assert re.findall(r"^- `(\w+)", lists[name], re.MULTILINE) == members(protocols()[name])


def test_no_other_section_lists_members():
    assert sorted(documented_members()) == sorted(KINDS[k] for k, p in KIND_PROTOCOLS.items() if p)


@pytest.mark.parametrize("kind", sorted(KIND_PROTOCOLS))
def test_each_registration_hook_names_its_protocols(kind):
    doc = " ".join((inspect.getdoc(getattr(hookspecs, KINDS[kind])) or "").split())
    for name in KIND_PROTOCOLS[kind]:
        assert f"rlax.core.contracts.{name}" in doc


# -- the built-in components satisfy them ------------------------------------------


@pytest.fixture(scope="module")
def builtins():
    return build_plugin_manager(autoload=False)


def build(pm, kind: str, name: str) -> object:
    """The component built with its defaults, or with the few settings it requires."""
    required: dict[tuple[str, str], dict[str, object]] = {
        ("algorithms", "drgrpo"): {"max_len": 4},
        ("curation", "decontaminate"): {"eval_texts": ["a held-out question"]},
        ("curation", "pass_rate"): {
            "reward": pm.get("rewards", "arithmetic").factory(),
            "policy": pm.get("samplers", "jax").factory(),
        },
        ("rewards", "composite"): {"rewards": [pm.get("rewards", "arithmetic").factory()]},
        ("rewards", "judge"): {
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
            "api_key_env": "",
        },
        ("rewards", "length"): {"max_length": 10},
        ("rewards", "overlong"): {"max_length": 10, "cache_length": 2},
        ("tasks", "dataset"): {"train_files": ["train.jsonl"]},
        ("environments", "python_tool"): {"reward": pm.get("rewards", "arithmetic").factory()},
        ("samplers", "agents"): {
            "sampler": pm.get("samplers", "jax").factory(),
            "agent": pm.get("agents", "calculator").factory,
        },
        ("samplers", "episodes"): {
            "sampler": pm.get("samplers", "jax").factory(),
            "environment": pm.get("environments", "guess").factory(),
        },
    }
    return pm.get(kind, name).factory(**required.get((kind, name), {}))


def accepts(implementation: object, protocol_method: typing.Callable) -> bool:
    """Whether ``implementation`` can be called as the core calls ``protocol_method``."""
    wanted = list(inspect.signature(protocol_method).parameters.values())[1:]  # not self
    params = inspect.signature(implementation).parameters.values()  # bound: no self
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    star_args = any(p.kind is p.VAR_POSITIONAL for p in params)
    star_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    n_positional = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in wanted)
    keywords = {p.name for p in wanted if p.kind is p.KEYWORD_ONLY}
    required = {
        p.name
        for p in params
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    taken = {p.name for p in positional[:n_positional]} | keywords
    return (
        (len(positional) >= n_positional or star_args)
        and all(k in by_name or star_kwargs for k in keywords)
        and required <= taken
    )


def satisfies(component: object, name: str) -> bool:
    protocol = protocols()[name]
    for member in members(protocol):
        if not hasattr(component, member):
            condition = CONDITIONAL.get((name, member))
            if condition is None or condition(component):
                return False
            continue
        declared = inspect.getattr_static(protocol, member)
        if inspect.isfunction(declared) and not accepts(getattr(component, member), declared):
            return False
    return True


def test_satisfies_tells_a_component_that_lacks_a_member_or_takes_other_arguments():
    class Good:
        def score(self, prompt, completion_text):
            return 0.0

    class NoScore:
        pass

    class KeywordOnly:
        def score(self, *, prompt, completion_text):  # the core passes them by position
            return 0.0

    class NeedsMore:
        def score(self, prompt, completion_text, length):
            return 0.0

    assert satisfies(Good(), "Reward")
    assert not satisfies(NoScore(), "Reward")
    assert not satisfies(KeywordOnly(), "Reward")
    assert not satisfies(NeedsMore(), "Reward")


def test_a_critic_is_required_to_name_its_value_model(builtins):
    assert satisfies(
        build(builtins, "algorithms", "grpo"), "Algorithm"
    )  # no critic, no value_model
    ppo = build(builtins, "algorithms", "ppo")
    assert ppo.needs_critic and satisfies(ppo, "Algorithm")

    class CriticWithoutModel:
        needs_reference, needs_critic = False, True

        def advantages(self, rewards):
            return rewards

        def loss(self, new_logprobs, batch):
            return 0.0, {}

    assert not satisfies(CriticWithoutModel(), "Algorithm")


@pytest.mark.parametrize("kind", ["algorithms", "rewards", "samplers", "tasks", "critics"])
def test_every_built_in_component_satisfies_its_kind_s_protocol(builtins, kind):
    (protocol, *_) = KIND_PROTOCOLS[kind]
    names = builtins.names(kind)
    assert names
    assert [n for n in names if not satisfies(build(builtins, kind, n), protocol)] == []


# What each built-in filter and task can do: found by isinstance on the built object.
CAPABILITIES = {
    ("curation", "decontaminate"): {"OfflineFilter"},
    ("curation", "dedup"): {"OfflineFilter"},
    ("curation", "dynamic_sampling"): {"OnlineFilter", "Refilling"},
    ("curation", "length"): {"OfflineFilter"},
    ("curation", "pass_rate"): {"OfflineFilter"},
    ("curation", "pass_rate_curriculum"): {"OnlineFilter", "Curriculum", "Stateful"},
    ("curation", "zero_variance"): {"OnlineFilter"},
    ("tasks", "arithmetic"): {"Task"},
    ("tasks", "dataset"): {"Task", "Dataset"},
    ("tasks", "guess"): {"Task"},
}


@pytest.mark.parametrize(("kind", "name"), sorted(CAPABILITIES))
def test_built_in_capabilities_are_what_isinstance_finds(builtins, kind, name):
    component = build(builtins, kind, name)
    runtime = {
        p for p in KIND_PROTOCOLS[kind] if getattr(protocols()[p], "_is_runtime_protocol", False)
    }
    found = {p for p in runtime if isinstance(component, protocols()[p])}
    assert found == CAPABILITIES[kind, name] & runtime
    assert all(satisfies(component, p) for p in CAPABILITIES[kind, name])


def test_every_built_in_filter_and_task_is_in_the_table(builtins):
    table = {kind_name for kind_name in CAPABILITIES}
    listed = {(k, n) for k in ("curation", "tasks") for n in builtins.names(k)}
    assert listed == table


def test_capability_protocols_are_runtime_checkable_and_the_others_are_not():
    runtime = {n for n, p in protocols().items() if getattr(p, "_is_runtime_protocol", False)}
    assert {"OnlineFilter", "OfflineFilter", "Curriculum", "Refilling", "Stateful", "Dataset"} <= (
        runtime
    )
    assert not runtime & {"Algorithm", "Sampler", "Reward", "Task"}


# -- the core is typed with them, and gin reads the types ----------------------------


@pytest.fixture
def core_configurables():
    config.register_core_configurables()
    yield
    gin.clear_config()


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (
            "rlax.run",
            {
                "task": "Task",
                "reward": "Reward",
                "sampler": "Sampler",
                "curation": "Sequence[OnlineFilter]",
            },
        ),
        ("rlax.train", {"algorithm": "Algorithm | None"}),
        ("rlax.param_server", {"curricula": "Sequence[Curriculum]"}),
    ],
)
def test_entry_points_are_typed_with_the_contracts(core_configurables, selector, expected):
    hints = bindings.hints(selector)

    def named(annotation) -> str:
        if typing.get_origin(annotation) is Sequence:
            return f"Sequence[{typing.get_args(annotation)[0].__name__}]"
        if type(None) in typing.get_args(annotation):  # unset until an algorithm file sets it
            return f"{named(_protocol(annotation))} | None"
        return annotation.__name__

    assert {param: named(hints[param]) for param in expected} == expected
    for param in expected:
        protocol = _protocol(hints[param])
        assert protocol is protocols()[protocol.__name__]


def _protocol(annotation):
    """The contract in ``Sequence[P]``, ``P | None`` or ``P``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def test_gin_accepts_built_components_and_refuses_a_literal_for_a_protocol(builtins):
    config.register_core_configurables()  # as the CLI does; not left to an earlier test
    ok = [
        "rlax.run.task = @tasks.arithmetic()",
        "rlax.run.curation = [@curation.dynamic_sampling(), @curation.zero_variance()]",
        "rlax.run.param_server = @rlax.param_server()",  # as configs/base/roles.gin binds it
        "rlax.param_server.curricula = [@curation.pass_rate_curriculum()]",
    ]
    config.parse([], ok, plugins=builtins)
    gin.clear_config()
    with pytest.raises(ConfigError, match=r"rlax\.run\.task: expected Task, got str"):
        config.parse([], ["rlax.run.task = 'arithmetic'"], plugins=builtins)
    with pytest.raises(ConfigError, match=r"rlax\.run\.curation: expected .*OnlineFilter"):
        config.parse([], ["rlax.run.curation = ['zero_variance']"], plugins=builtins)
    gin.clear_config()


def test_a_name_where_a_component_is_expected_says_how_to_build_it(builtins):
    config.register_core_configurables()
    with pytest.raises(ConfigError) as info:
        config.parse([], ["rlax.run.task = 'arithmetic'"], plugins=builtins)
    assert str(info.value) == (
        "--gin.rlax.run.task = 'arithmetic': rlax.run.task: expected Task, got str; "
        "build one by reference, e.g. @tasks.arithmetic() (valid tasks: arithmetic, dataset, guess)"
    )
    with pytest.raises(
        ConfigError, match=r"e\.g\. @curation\.zero_variance\(\) \(valid curation: "
    ):
        config.parse([], ["rlax.run.curation = ['zero_variance']"], plugins=builtins)
    gin.clear_config()
