"""benchmarks/accelerator_check.sh on the CPU, tiny shape: one JSON line with sane figures."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_the_check_runs_on_cpu_with_a_tiny_shape_and_prints_one_json_line():
    out = subprocess.run(
        [
            "bash",
            str(ROOT / "benchmarks" / "accelerator_check.sh"),
            "--shape",
            "tiny",
            "--repeats",
            "1",
            "--rl-steps",
            "0",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=480,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"},
    )
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["ok"] is True and result["backend"] == "cpu" and result["shape"] == "tiny"
    assert result["peak_tflops"] > 0 and result["train_tok_s"] > 0 and result["sample_tok_s"] > 0
    # MFU is a fraction of the measured peak (a tiny model is far from it, never past 1).
    assert 0 < result["train_mfu"] < 1.5 and 0 < result["sample_mfu"] < 1.5
    assert result["peak_device_gb"] is None  # the CPU keeps no allocator statistics
    assert result["train_loss_finite"] is True
    assert result["rl_steps"] == 0


def test_a_failing_check_still_prints_one_json_line():
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "accelerator_check.sh"), "--shape", "nonsense"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert out.returncode != 0
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ok": False, "error": "exit 2"}
