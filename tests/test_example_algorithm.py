"""examples/rlax-example-algorithm: a third-party algorithm by composition, selected from gin."""

from __future__ import annotations

import ast
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_runs import NO_CURVES, SMALL_SIZES

from rlax.plugins import algorithms

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rlax-example-algorithm"


@pytest.fixture
def lite_ppo_module(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from rlax_example_algorithm import lite_ppo

    return sys.modules[lite_ppo.__module__]


def test_module_is_about_forty_lines():
    assert len((EXAMPLE / "rlax_example_algorithm" / "lite_ppo.py").read_text().splitlines()) <= 45


def test_the_example_algorithm_imports_only_public_names():
    source = EXAMPLE / "rlax_example_algorithm" / "lite_ppo.py"
    tree = ast.parse(source.read_text())
    imported = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (node.module or "").startswith("rlax.plugins")
    ]
    assert imported == [("rlax.plugins", "algorithms")]
    plain = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [name for name in plain if name.startswith("rlax.plugins")]
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "algos"
    }
    assert used and used <= set(algorithms.__all__)


def test_advantages_use_the_group_mean_and_the_batch_std(lite_ppo_module):
    # Group means 0.5 and 1; batch rewards [1, 0, 1, 1]: std sqrt(0.1875).
    adv = lite_ppo_module.lite_ppo().advantages(np.array([[1.0, 0.0], [1.0, 1.0]]))
    s = math.sqrt(0.1875)
    np.testing.assert_allclose(adv, [[0.5 / s, -0.5 / s], [0.0, 0.0]], rtol=1e-5)


def test_loss_is_the_token_mean_clipped_surrogate(lite_ppo_module):
    algo = lite_ppo_module.lite_ppo(clip_eps=0.2)
    batch = {
        "loss_mask": jnp.array([[1.0, 1.0], [1.0, 0.0]]),
        "old_logprobs": jnp.array([[-1.0, -1.0], [-1.0, 0.0]]),
        "advantages": jnp.array([[2.0, 2.0], [-1.0, 0.0]]),
    }
    new = jnp.array([[-0.5, -1.0], [-1.0, 0.0]])  # row 0 token 0: ratio e^0.5 > 1.2, clipped
    loss, metrics = algo.loss(new, batch)
    assert float(loss) == pytest.approx((-1.2 * 2 - 2.0 + 1.0) / 3, rel=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda lp: algo.loss(lp, batch)[0])(new),
        [[0.0, -2.0 / 3], [1.0 / 3, 0.0]],
        rtol=1e-6,
    )
    assert float(metrics["clip_fraction"]) == pytest.approx(1 / 3)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    """The example package pip-installed (no deps, no network) into its own directory."""
    work = tmp_path_factory.mktemp("example-algorithm")
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


@pytest.mark.e2e
def test_gin_selects_the_installed_algorithm_for_a_real_run(installed):
    run_dir = installed.parent / "run"
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("RLAX_DISABLE_PLUGIN_AUTOLOAD", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlax.core.cli",
            "run",
            "--role",
            "inline",
            "--gin",
            str(ROOT / "configs/experiments/quickstart.gin"),
            "--gin",
            str(EXAMPLE / "lite_ppo.gin"),
            f"--gin.INIT_CHECKPOINT='{ROOT / 'assets' / 'quickstart-base'}'",
            "--gin.rlax.train.steps=3",
            *SMALL_SIZES,
            "--gin.algorithms.lite_ppo.clip_eps=0.25",
            "--gin.rlax.train.progress=False",
            NO_CURVES,
            "--gin.rlax.evaluate.progress=False",
            "--run-dir",
            str(run_dir),
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=installed,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    config = (run_dir / "operative_config.gin").read_text()
    assert "@algorithms.lite_ppo()" in config and "clip_eps = 0.25" in config
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert all(math.isfinite(r["loss"]) for r in rows if r["groups_kept"])
    assert any(r["groups_kept"] and r["grad_norm"] > 0 for r in rows)  # it trained
