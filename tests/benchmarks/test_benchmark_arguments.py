"""Benchmarks refuse, at once, arguments that cannot give the figure they report."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def refusal(script: str, *args: str) -> str:
    """The last line of ``benchmarks/<script> args``' stderr; its exit status must be 2."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 2, out.stderr
    return out.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "script,args",
    [("lora.py", ["--skip", "memory"]), ("algorithms.py", [])],
)
def test_pass_at_8_with_fewer_than_8_samples_is_refused_before_any_run(script, args):
    assert refusal(script, "--eval-samples", "4", *args).endswith(
        "error: --eval-samples: pass@8 needs at least 8 samples, got 4"
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--base", "no-such-model"], "--base no-such-model: no model.json there"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
    ],
)
def test_moe_benchmark_refuses_a_missing_base_or_no_steps_before_any_run(args, message):
    assert message in refusal("moe.py", *args)
