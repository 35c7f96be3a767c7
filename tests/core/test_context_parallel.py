"""Runs ``context_checks.py`` on 8 fake CPU devices in a subprocess, once per module.

The main pytest process has JAX started with one device, so the context-parallel
checks run in their own interpreter; each of their test functions is reported here as
one test that fails unless every case of it passed (a skip is a failure).
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from cli_runs import fake_devices

pytestmark = pytest.mark.e2e

CHECKS = pathlib.Path(__file__).with_name("context_checks.py")
NAMES = [
    node.name
    for node in ast.parse(CHECKS.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    report = tmp_path_factory.mktemp("context") / "report.xml"
    env = dict(os.environ, XLA_FLAGS=fake_devices(8), JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CHECKS)]
    proc = subprocess.run(
        [*command, f"--junitxml={report}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=CHECKS.parent,
    )
    results: dict[str, list[tuple[str, str, str]]] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            failed = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            detail = "".join((c.get("message") or "") + (c.text or "") for c in case)
            name = case.get("name", "")
            results.setdefault(name.split("[")[0], []).append(
                (name, failed[0] if failed else "passed", detail)
            )
    return results, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("name", NAMES)
def test_on_eight_devices(outcomes, name):
    results, log = outcomes
    cases = results.get(name)
    assert cases, f"{name} did not run on 8 devices:\n{log}"
    bad = [(c, o, d[-2000:]) for c, o, d in cases if o != "passed"]
    assert not bad, "\n\n".join(f"{c}: {o}\n{d}" for c, o, d in bad)
