"""benchmarks/memory.py: its floors by hand, its /proc readings, and a tiny run's JSON line."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from rlax.core.models.config import TransformerConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "memory.py"


def load():
    spec = importlib.util.spec_from_file_location("memory_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_floors_by_hand():
    m = load()
    assert m.trainer_floor_bytes(135_000_000) == 2_160_000_000  # 4 fp32 copies: 2.16 GB
    cfg = TransformerConfig.smollm2_135m()  # 30 layers, 3 KV heads of 64
    # 32 rows x 88 slots x 30 layers x (k, v) x 3 x 64 x 4 bytes
    assert m.kv_cache_bytes(cfg, 32, 88) == 32 * 88 * 30 * 2 * 3 * 64 * 4 == 129_761_280


def test_role_and_peak_of_a_live_process():
    m = load()
    assert m.role_of(["python", "-m", "rlax.core.cli", "run", "--role", "worker"]) == "worker"
    assert m.role_of(["python", "-m", "rlax.core.cli", "run"]) is None
    assert m.role_of(["x", "--role"]) is None
    # A child that holds 200 MB: its VmHWM says at least that, and it is found under us.
    code = (
        "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, "--role", "probe"])
    try:
        for _ in range(100):
            found = m.descendants(os.getpid())
            if child.pid in found and m.vm_hwm_bytes(child.pid) > 200 * 2**20:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert m.role_of(found[child.pid]) == "probe"
        assert 200 * 2**20 < m.vm_hwm_bytes(child.pid) < 400 * 2**20
    finally:
        child.kill()
        child.wait()
    assert m.vm_hwm_bytes(child.pid) == 0  # gone


@pytest.mark.e2e
def test_tiny_run_prints_the_issues_keys_and_a_train_peak_above_its_floor():
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--skip-smollm2",
            "--tiny",
            "--qwen-rows=2",
            "--qwen-seq=16",
            "--qwen-new=4",
            "--qwen-microbatches=2",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=280,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) == {
        "trainer_peak_gb",
        "trainer_floor_gb",
        "ps_peak_gb",
        "worker_peak_gb",
        "qwen05b_train_peak_gb",
    }
    assert result["trainer_peak_gb"] is None  # the SmolLM2 section was skipped
    # A process with JAX loaded and a step compiled holds well over 0.1 GB.
    assert 0.1 < result["qwen05b_train_peak_gb"] < 4.0
    assert "tiny train step" in out.stderr and "tiny sampling batch" in out.stderr
