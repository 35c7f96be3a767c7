"""The README's two commands: CI runs exactly the second, and the first names a real config."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from rlax.core import config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The one-line commands of the README's first two ``bash`` blocks."""
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.DOTALL)
    return [block.strip() for block in blocks[:2]]


def test_ci_runs_exactly_the_readme_s_test_command():
    _, test_command = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()

    assert "\n" not in test_command
    assert f'bash -c "{test_command}"' in ci


def test_both_commands_set_up_the_same_way_with_the_extras_the_tests_need():
    quickstart, tests = readme_commands()
    setup = "python3.11 -m venv .venv && . .venv/bin/activate && pip install "

    assert quickstart.startswith(setup + "-e . && ")
    # --no-compile: the suite writes the bytecode of what it imports (tests/conftest.py);
    # the quickstart's processes may run where none is written, so its install compiles.
    assert tests == (
        setup + "--no-compile -e '.[test,hf]' && python -m pytest -q -n auto "
        "--random-order-bucket=module"
    )


def test_the_quickstart_command_names_a_packaged_config():
    quickstart, _ = readme_commands()

    (name,) = re.findall(r"rlax run --gin (\S+)$", quickstart)
    assert (ROOT / "configs" / "experiments" / f"{name}.gin").is_file()
    assert config.find_gin_file(name) == str(config.packaged_configs()[name])


def test_every_extra_we_ask_of_a_dependency_is_one_it_provides():
    """pip warns 'X does not provide the extra Y' for a misspelt extra; none of ours may."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [spec for group in project["optional-dependencies"].values() for spec in group]
    specs = [*project["dependencies"], *extras]
    asked = [(r.name, extra) for r in map(Requirement, specs) for extra in r.extras]

    missing = [
        f"{name}[{extra}]"
        for name, extra in asked
        if extra not in (importlib.metadata.metadata(name).get_all("Provides-Extra") or [])
    ]
    assert asked  # the check has something to check
    assert missing == []


def collected(*args: str) -> tuple[list[str], set[str]]:
    """The test ids a pytest collection lists, in order, and the random orders it says."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0"]
        + ["-p", "no:cacheprovider", *args, *SAMPLE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    return ids, set(re.findall(r"^random order: (.*) \(add it", out, re.MULTILINE))


SAMPLE = ("tests/test_readme_commands.py", "tests/core/test_configurables.py")


def test_the_random_order_a_run_says_replays_that_order():
    plain, said = collected()
    shuffled, (order,) = collected("--random-order-bucket=module")
    replayed, again = collected(*order.split())

    assert said == set()
    assert sorted(shuffled) == sorted(plain)  # the same tests, in the order that was said
    assert replayed == shuffled
    assert again == {order}
