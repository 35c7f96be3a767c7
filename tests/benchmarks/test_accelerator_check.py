"""benchmarks/accelerator_check.sh on the CPU, tiny shape: one JSON line with sane figures."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from cli_runs import fake_devices

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
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHON": sys.executable,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": fake_devices(2),  # two devices: both modes
        },
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
    # Each mode on the two devices: colocated shares both, split gives each role one.
    modes = result["modes"]
    assert [(m, v["trainer_devices"], v["sampler_devices"]) for m, v in modes.items()] == [
        ("colocated", 2, 2),
        ("split", 1, 1),
    ]
    assert all(v["step_s"] > 0 and v["sample_tok_s"] > 0 for v in modes.values())
    # The handoff and the parameter server move the same bytes: the weights in bf16.
    assert result["handoff_bytes"] == 2 * result["params"]
    assert result["handoff_s"] > 0 and result["ps_push_pull_s"] > 0
    assert result["handoff_vs_ps"] == pytest.approx(
        result["handoff_s"] / result["ps_push_pull_s"], rel=0.01, abs=1e-4
    )


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


@pytest.mark.parametrize(
    "env, args, error",
    [
        ({}, ["--fetch-wheels", "/tmp/w", "rocm"], "extra: cuda, tpu or cpu, got 'rocm'"),
        ({}, ["--fetch-wheels", "/tmp/w"], "usage: --fetch-wheels DIR cuda|tpu|cpu"),
        ({"RLAX_WHEELS": "/nonexistent"}, [], "wheels: RLAX_WHEELS=/nonexistent is not a folder"),
        ({"RLAX_CHECK_EXTRA": "rocm"}, [], "extra: cuda, tpu or cpu, got 'rocm'"),
        ({"RLAX_CHECK_EXTRA": "cpu"}, [], "wheels: pip could not install rlax-llm from {} alone"),
    ],
)
def test_carried_wheels_that_cannot_work_fail_in_one_json_line(tmp_path, env, args, error):
    """A wheel folder without rlax's wheels (here: empty) is refused before anything runs."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    env = {"RLAX_WHEELS": str(wheels), **env} if "RLAX_CHECK_EXTRA" in env else env
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "RLAX_CHECK_VENV": str(tmp_path / "v"),
        **env,
    }
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "accelerator_check.sh"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )
    assert out.returncode == 2
    assert json.loads(out.stdout.strip()) == {"ok": False, "error": error.format(wheels)}
