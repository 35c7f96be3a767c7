"""The Dockerfile installs what the README installs (docker cannot run here, so its install
step is run with a pip that records what it was asked), and builds the image the deploy
manifests name."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess

import pytest
import yaml
from test_readme_commands import readme_commands

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines)
        if word and not word.startswith("#")
    ]


def readme_pip_install() -> list[str]:
    """The arguments of the README quickstart's ``pip install``."""
    quickstart, _ = readme_commands()
    (args,) = re.findall(r"pip install (.*?) &&", quickstart)
    return shlex.split(args)


def run_install(tmp_path: pathlib.Path, accelerator: str) -> subprocess.CompletedProcess:
    """The Dockerfile's install step under sh, with a ``pip`` that writes its arguments."""
    (step,) = [args for kind, args in instructions() if kind == "RUN" and "pip install" in args]
    record = tmp_path / "pip-args"
    fake = tmp_path / "bin" / "pip"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done > {record}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "ACCELERATOR": accelerator}
    return subprocess.run(["sh", "-c", step], env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("accelerator, extra", [("cpu", ""), ("cuda", "[cuda]"), ("tpu", "[tpu]")])
def test_the_image_installs_the_readme_s_package_with_the_accelerator_s_extra(
    tmp_path, accelerator, extra
):
    done = run_install(tmp_path, accelerator)
    assert done.returncode == 0, done.stderr
    asked = (tmp_path / "pip-args").read_text().split()
    expected = readme_pip_install()  # ["install", "-e", "."]
    assert expected[-1] == "."  # the package, last
    assert asked == ["install", *expected[:-1], expected[-1] + extra]


def test_an_unknown_accelerator_stops_the_build_in_one_line(tmp_path):
    done = run_install(tmp_path, "rocm")
    assert done.returncode == 2
    assert done.stderr.strip() == "ACCELERATOR: cpu, cuda or tpu, got 'rocm'"
    assert not (tmp_path / "pip-args").exists()


def test_the_extras_the_image_asks_for_are_the_project_s():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    assert extras["cuda"] == ["jax[cuda12]>=0.6"] and extras["tpu"] == ["jax[tpu]>=0.6"]


def test_the_image_is_python_3_11_at_the_repository_root_in_a_venv():
    steps = instructions()
    quickstart, _ = readme_commands()
    (base,) = [args for kind, args in steps if kind == "FROM"]
    (python,) = [args for kind, args in steps if kind == "ARG" and args.startswith("PYTHON=")]
    assert base == "python:${PYTHON}-slim"
    assert quickstart.startswith(f"python{python.removeprefix('PYTHON=')} -m venv .venv")
    (workdir,) = [args for kind, args in steps if kind == "WORKDIR"]
    (copy,) = [args for kind, args in steps if kind == "COPY"]
    assert copy == f". {workdir}"  # the manifests' commands run from the repository root
    assert ("RUN", f"python -m venv {workdir}/.venv") in steps
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "runs"} <= set(ignored)  # the build context is the repository


def test_every_manifest_names_the_image_the_dockerfile_documents():
    (tag,) = set(re.findall(r"docker build .*-t (\S+) \.", DOCKERFILE))
    images = set()
    for path in (ROOT / "examples" / "deploy").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            images.update(re.findall(r"'image': '([^']+)'", str(doc)))
    assert images == {tag}
