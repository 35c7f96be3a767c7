"""A component that refuses its settings as gin builds it is a configuration error.

The law (``rlax.core.config.building``): an error of the refusal kinds raised
while gin builds a role's arguments, before the role's own code runs, reaches
the role's caller as a ConfigError, one line naming the component; raised once
the role's code runs (in its body, or by a component's method), it keeps its
type and its traceback.
"""

from __future__ import annotations

import gin
import pytest

from rlax.core import config
from rlax.core.config.building import BUILD_REFUSALS
from rlax.core.errors import ConfigError

REFUSALS = {
    ValueError: ("btest.part: size must be even, got 3", "btest.part: size must be even, got 3"),
    TypeError: ("expected a list of paths", "btest.part: expected a list of paths"),
    KeyError: ("tokenizer", "btest.part: no 'tokenizer'"),
    FileNotFoundError: ("data/x.jsonl: no such file", "btest.part: data/x.jsonl: no such file"),
    NotADirectoryError: ("assets: not a folder", "btest.part: assets: not a folder"),
    IsADirectoryError: ("assets: a folder", "btest.part: assets: a folder"),
    IndexError: ("no split 3", "btest.part: no split 3"),
}


class Part:
    def __init__(self, *, raises: str = "", message: str = ""):
        if raises:
            raise _type(raises)(message)

    def use(self, raises: str = "") -> None:
        if raises:
            raise _type(raises)("the method")


def _type(name: str) -> type[BaseException]:
    return next(t for t in REFUSALS if t.__name__ == name)


def role(*, part: Part | None = None, fails_with: str = "", part_fails_with: str = "") -> str:
    if fails_with:
        raise _type(fails_with)("the role's own code")
    if part is not None:
        part.use(part_fails_with)
    return "ran"


@pytest.fixture(autouse=True)
def fresh_gin():
    config.register_configurables("btest", {"part": Part, "role": role}, exclusive=True)
    gin.clear_config()
    yield
    gin.clear_config()


def test_every_refusal_kind_is_covered_by_the_table():
    assert all(issubclass(t, BUILD_REFUSALS) for t in REFUSALS)
    assert all(any(issubclass(t, kind) for t in REFUSALS) for kind in BUILD_REFUSALS)


@pytest.mark.parametrize("kind", list(REFUSALS), ids=lambda t: t.__name__)
def test_a_component_refusing_as_it_is_built_is_one_line_naming_it(kind):
    message, expected = REFUSALS[kind]
    config.parse(
        [],
        [
            "btest.role.part = @btest.part()",
            f"btest.part.raises = {kind.__name__!r}",
            f"btest.part.message = {message!r}",
        ],
    )

    with pytest.raises(ConfigError) as info:
        config.configured("btest", "role")()

    assert str(info.value) == expected
    assert isinstance(info.value.__cause__, kind)  # the original is kept for a debugger


@pytest.mark.parametrize("kind", list(REFUSALS), ids=lambda t: t.__name__)
def test_an_error_once_the_role_runs_keeps_its_type(kind):
    config.parse([], ["btest.role.part = @btest.part()"])
    with pytest.raises(kind) as in_body:
        config.configured("btest", "role")(fails_with=kind.__name__)
    with pytest.raises(kind) as in_method:
        config.configured("btest", "role")(part_fails_with=kind.__name__)

    assert not isinstance(in_body.value, ConfigError)
    assert not isinstance(in_method.value, ConfigError)
    assert "the method" in str(in_method.value)


def test_a_component_built_fine_leaves_the_role_s_result_alone():
    config.parse([], ["btest.role.part = @btest.part()"])
    assert config.configured("btest", "role")() == "ran"


def test_an_error_outside_the_refusal_kinds_is_not_a_configuration_error():
    config.parse([], ["btest.role.part = @btest.part()", "btest.part.raises = 'ValueError'"])
    with pytest.raises(ConfigError):
        config.configured("btest", "role")()
    gin.clear_config()

    def crashing(**_):
        raise MemoryError("out of host memory")

    config.register_configurables("btest", {"crashing": crashing}, exclusive=False)
    config.parse([], ["btest.role.part = @btest.crashing()"])
    with pytest.raises(MemoryError):  # a crash: the supervisor may restart it
        config.configured("btest", "role")()


class Holder:
    """A class configurable: its own code is its ``__init__``."""

    def __init__(self, *, part: Part | None = None, refuse: bool = False):
        if refuse:
            raise ValueError("the holder's own check")
        self.part = part


def test_a_class_configurable_s_own_check_keeps_its_type_and_its_parts_refusals_are_config_errors():
    config.register_configurables("btest", {"holder": Holder}, exclusive=False)
    config.parse([], ["btest.holder.part = @btest.part()", "btest.part.raises = 'ValueError'"])
    with pytest.raises(ConfigError, match=r"^btest.part: ValueError$"):  # no message: the kind
        config.configured("btest", "holder")()
    gin.clear_config()
    config.parse([], ["btest.holder.refuse = True"])
    with pytest.raises(ValueError, match="the holder's own check") as info:
        config.configured("btest", "holder")()
    assert not isinstance(info.value, ConfigError)
