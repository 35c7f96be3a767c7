"""examples/rlax-example-plugin: the reward itself, and the package installed for real."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rlax-example-plugin"
BUILTINS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["rlax"]


@pytest.fixture
def shouting(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from rlax_example_plugin.shouting import ShoutingReward

    return ShoutingReward


@pytest.mark.parametrize(
    ("text", "min_length", "expected"),
    [
        ("HELLO world", 1, 0.5),  # 5 of 10 letters
        ("ABC", 1, 1.0),
        ("A1b2!", 1, 0.5),  # digits and punctuation are not letters
        ("", 1, 0.0),
        ("ABC", 4, 0.0),  # 3 letters < min_length
        ("ABCd", 4, 0.75),
    ],
)
def test_score_is_the_fraction_of_uppercase_letters(shouting, text, min_length, expected):
    assert shouting(min_length=min_length).score(None, text) == expected


def test_settings_are_keyword_only(shouting):
    with pytest.raises(TypeError):
        shouting(4)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """The example package pip-installed (no deps, no network) into its own directory."""
    work = tmp_path_factory.mktemp("example")
    source = work / "src"
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = work / "target"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return target


def run_python(installed: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("RLAX_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, *args], check=False, capture_output=True, text=True, env=env, cwd=installed
    )


def blocked_builtins() -> list[str]:
    """``-p no:NAME`` for each built-in plugin, so only the example is listed."""
    return [arg for name in BUILTINS for arg in ("-p", f"no:{name}")]


def test_installed_plugin_is_discovered_through_its_entry_point(installed):
    result = run_python(installed, "-m", "rlax.core.cli", "plugins", "--json", *blocked_builtins())

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {
            "kind": "rewards",
            "name": "shouting",
            "plugin": "shouting",
            "distribution": "rlax-example-plugin",
            "version": "0.1.0",
        }
    ]


def test_installed_plugin_can_be_blocked(installed):
    argv = ["-m", "rlax.core.cli", "plugins", "--json", *blocked_builtins(), "-p", "no:shouting"]
    result = run_python(installed, *argv)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_gin_reference_builds_the_installed_class(installed):
    (installed.parent / "reward.gin").write_text(
        "rewards.shouting.min_length = 4\nprobe.reward = @rewards.shouting()\n"
    )
    script = textwrap.dedent(
        f"""
        import inspect, json
        from rlax.core import config, plugins

        def probe(*, reward):
            return reward

        pm = plugins.build_plugin_manager(disabled={list(BUILTINS)!r})
        config.register_configurables("test", {{"probe": probe}})
        config.parse([{str(installed.parent / "reward.gin")!r}], plugins=pm)
        reward = config.configured("test", "probe")()
        cls = pm.get("rewards", "shouting").factory
        print(json.dumps({{
            "class": f"{{cls.__module__}}.{{cls.__qualname__}}",
            "file": inspect.getfile(cls),
            "is_instance": isinstance(reward, cls),
            "min_length": reward.min_length,
            "scores": [reward.score(None, "HELLO world"), reward.score(None, "HEY")],
        }}))
        """
    )
    result = run_python(installed, "-c", script)

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["class"] == "rlax_example_plugin.shouting.ShoutingReward"
    assert pathlib.Path(out["file"]).is_relative_to(installed)
    assert out["is_instance"] is True
    assert out["min_length"] == 4
    assert out["scores"] == [0.5, 0.0]  # "HEY" has 3 letters < min_length 4
