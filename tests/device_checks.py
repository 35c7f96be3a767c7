"""Checks that need several devices, run on fake CPU devices in a subprocess.

The suite's own process has JAX started with one device, so a module of checks that needs
eight runs in an interpreter of its own (imported by tests as ``device_checks``). Two
kinds: a pytest module (:func:`pytest_on_devices`: each of its test functions is reported
back as one test that fails unless every case of it passed -- a skip is a failure) and a
script that prints its results as one JSON line (:func:`script_on_devices`).
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

from cli_runs import fake_devices

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: ``{test function: [(case, "passed" | "failure" | "error" | "skipped", detail), ...]}``
Outcomes = dict[str, list[tuple[str, str, str]]]


def check_names(checks: pathlib.Path) -> list[str]:
    """The test functions a checks module defines (one suite test each)."""
    tree = ast.parse(checks.read_text())
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]


def _environment(devices: int) -> dict[str, str]:
    return dict(os.environ, XLA_FLAGS=fake_devices(devices), JAX_PLATFORMS="cpu")


def pytest_on_devices(
    checks: pathlib.Path,
    report_dir: pathlib.Path,
    *,
    devices: int = 8,
    timeout: float = 600,
    cwd: pathlib.Path = ROOT,
) -> tuple[Outcomes, str]:
    """Runs the pytest module ``checks`` on ``devices`` fake devices (from ``cwd``: its
    folder when it imports a module beside it): its outcomes by test function, and the tail
    of what it printed."""
    report = report_dir / "report.xml"
    # A case still running after most of the time dumps every thread's stack (pytest's
    # faulthandler), so a hang reports where it hangs instead of only that it timed out.
    dump = f"faulthandler_timeout={max(1, int(timeout * 0.8))}"
    proc = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", dump, str(checks)]
        + [f"--junitxml={report}"],
        devices,
        timeout,
        cwd,
    )
    if isinstance(proc, str):  # timed out: no outcomes, the output says where it stood
        return {}, proc
    outcomes: Outcomes = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            failed = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            detail = "".join((c.get("message") or "") + (c.text or "") for c in case)
            name = case.get("name", "")
            outcomes.setdefault(name.split("[")[0], []).append(
                (name, failed[0] if failed else "passed", detail)
            )
    return outcomes, proc.stdout[-4000:] + proc.stderr[-4000:]


def assert_passed(outcomes: tuple[Outcomes, str], name: str, devices: int = 8) -> None:
    """Fails unless every case of the checks' test ``name`` ran and passed."""
    results, log = outcomes
    cases = results.get(name)
    assert cases, f"{name} did not run on {devices} devices:\n{log}"
    bad = [(c, o, d[-2000:]) for c, o, d in cases if o != "passed"]
    assert not bad, "\n\n".join(f"{c}: {o}\n{d}" for c, o, d in bad)


def _run(
    command: list[str], devices: int, timeout: float, cwd: pathlib.Path | None = None
) -> subprocess.CompletedProcess | str:
    """``command`` on ``devices`` fake devices; on a timeout, what it printed (its tail)."""
    try:
        return subprocess.run(
            command,
            env=_environment(devices),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as e:
        out, err = (
            (x or b"").decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (e.stdout, e.stderr)
        )
        return f"timed out after {timeout:.0f} s; its output's tail:\n{out[-4000:]}{err[-8000:]}"


def script_on_devices(script: pathlib.Path, *, devices: int = 8, timeout: float = 600) -> Any:
    """Runs ``script`` on ``devices`` fake devices and returns the JSON of its last line."""
    proc = _run([sys.executable, str(script)], devices, timeout)
    assert not isinstance(proc, str), proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
