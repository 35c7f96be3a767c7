"""The trainer role as two JAX processes (4 fake CPU devices each) against a real cluster.

A parameter server and a worker (``rlax run --role param_server|worker``) and
two trainer processes (``rlax run --role trainer`` under
``jax.distributed.initialize``, through ``multihost_trainer.py``, which only
records what they do) run the quickstart, deterministic and on-policy, on a
data 2 x fsdp 2 x tensor 2 mesh. A SIGTERM reaches one trainer process after
its second step; both stop after that step, checkpoint, exit 75, and started
again resume from that checkpoint and finish.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile

import gin
import jax
import numpy as np
import pytest
from cli_runs import NO_CURVES, fake_devices
from flax import nnx

from rlax.core import config
from rlax.core.models.bundle import load_model
from rlax.core.param_server.client import ParamServerClient
from rlax.core.param_server.settings import ServerSettings
from rlax.core.plugins import build_plugin_manager
from rlax.core.trainer.optimizer import build_optimizer
from rlax.core.trainer.phases import WALL_CLOCK
from rlax.core.trainer.step import Trainer
from rlax.core.wire import leaf_name

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).parent
BASE = ROOT / "assets" / "quickstart-base"
GIN = ROOT / "configs/experiments/quickstart.gin"
STEPS, PROMPTS, GROUP = 3, 8, 8
TOKEN = "multihost-test-token"
ARGS = [
    "--gin",
    str(GIN),
    f"--gin.INIT_CHECKPOINT='{BASE}'",
    f"--gin.rlax.train.steps={STEPS}",
    f"--gin.PROMPTS_PER_STEP={PROMPTS}",
    f"--gin.GROUP_SIZE={GROUP}",
    "--gin.CURATION=[]",
    "--gin.MAX_STALENESS=0",
    "--gin.rlax.run.deterministic=True",
    f"--gin.rlax.worker.prompts_per_lease={PROMPTS}",
    "--gin.rlax.worker.reward_workers=0",
    # SGD: the update is linear in the gradient, so the sharded step's rounding stays at
    # rounding size (adam's normalisation can blow it up where a gradient is ~0).
    "--gin.rlax.clipped_optimizer.inner=@optax.sgd()",
    "--gin.optax.sgd.learning_rate=0.5",
    "--gin.tasks.arithmetic.num_eval=4",
    "--gin.rlax.held_out.samples=2",
    "--gin.rlax.held_out.ks=(1,)",
    "--gin.rlax.train.progress=False",
    NO_CURVES,
    "--gin.rlax.checkpointing.every=2",
]
MESH = [
    "--gin.rlax.train.mesh=@rlax.mesh()",
    "--gin.rlax.mesh.data=2",
    "--gin.rlax.mesh.fsdp=2",
    "--gin.rlax.mesh.tensor=2",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A parameter server and a worker as ``rlax run`` processes; trainer processes on demand."""

    def __init__(self, tmp: pathlib.Path):
        self.tmp, self.out, self.run_dir = tmp, tmp / "records", tmp / "run"
        self.out.mkdir()
        self.address = f"127.0.0.1:{free_port()}"
        cache = tempfile.mkdtemp(prefix="rlax-test-jax-cache-", dir=tmp)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_")}
        self.env.update(
            RLAX_PS_ADDRESS=self.address,
            RLAX_PS_TOKEN=TOKEN,
            JAX_PLATFORMS="cpu",
            JAX_COMPILATION_CACHE_DIR=cache,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
        self.services = [self._rlax("param_server"), self._rlax("worker")]

    def _rlax(self, role: str) -> subprocess.Popen:
        with (self.tmp / f"{role}.log").open("w") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "rlax.core.cli", "run", *ARGS, "--role", role],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def logs(self) -> str:
        """The parameter server's and the worker's output (for a failure's message)."""
        return "".join(
            f"--- {role}:\n" + (self.tmp / f"{role}.log").read_text()[-3000:]
            for role in ("param_server", "worker")
        )

    def train(self, notice_after: dict[int, int] | None = None) -> list[tuple[int, str]]:
        """Runs the two trainer processes to their end: [(status, output)] by process id."""
        coordinator = f"127.0.0.1:{free_port()}"
        procs = []
        for pid in range(2):
            env = dict(
                self.env,
                RLAX_COORDINATOR=coordinator,
                RLAX_NUM_PROCESSES="2",
                RLAX_PROCESS_ID=str(pid),
                XLA_FLAGS=fake_devices(4),
            )
            if notice_after and pid in notice_after:
                env["RLAX_TEST_NOTICE_AFTER_STEP"] = str(notice_after[pid])
            cmd = [
                sys.executable,
                str(HERE / "multihost_trainer.py"),
                str(self.out),
                *ARGS,
                *MESH,
                # Taken through rlax.train.distributed (bound alone it would be ignored:
                # refused); the processes' ids and coordinator come from RLAX_* variables.
                "--gin.rlax.train.distributed=@rlax.distributed()",
                "--gin.rlax.distributed.initialization_timeout_s=120",
                "--run-dir",
                str(self.run_dir),
            ]
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        try:
            outputs = [p.communicate(timeout=240)[0] for p in procs]
            return [(p.returncode, out) for p, out in zip(procs, outputs)]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()

    def stop(self) -> None:
        for p in self.services:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.services:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    def record(self, pid: int, start: int) -> tuple[dict, dict]:
        stem = self.out / f"process_{pid}-{start}"
        return json.loads(stem.with_suffix(".json").read_text()), dict(np.load(f"{stem}.npz"))


def global_batches(cluster: Cluster, start: int) -> list[dict[str, np.ndarray]]:
    """The global batch of every step of one start, put together from both processes' rows."""
    (r0, b0), (r1, b1) = cluster.record(0, start), cluster.record(1, start)
    assert len(r0["steps"]) == len(r1["steps"])
    out = []
    for i, (s0, s1) in enumerate(zip(r0["steps"], r1["steps"])):
        n = s0["global_rows"]
        # Each process fed its own rows; together every row once.
        assert sorted(s0["rows"] + s1["rows"]) == list(range(n)) and len(s0["rows"]) == n // 2
        names = {k.split(".", 1)[1] for k in b0 if k.startswith(f"{i}.")}
        batch = {}
        for name in names:
            x0, x1 = b0[f"{i}.{name}"], b1[f"{i}.{name}"]
            whole = np.zeros((n, *x0.shape[1:]), x0.dtype)
            whole[s0["rows"]], whole[s1["rows"]] = x0, x1
            batch[name] = whole
        out.append(batch)
    return out


def replay(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One process, one device: the run's algorithm and optimiser (from its gin) on ``batches``."""
    pm = build_plugin_manager()
    config.register_core_configurables()
    config.parse(
        [GIN], [a.removeprefix("--gin.") for a in ARGS if a.startswith("--gin.")], plugins=pm
    )
    algorithm = copy.deepcopy(gin.query_parameter("rlax.train.algorithm"))
    optimizer = build_optimizer(copy.deepcopy(gin.query_parameter("rlax.train.optimizer")))
    trainer = Trainer(load_model(BASE).model, algorithm, optimizer, temperature=1.0)
    for batch in batches:
        trainer.step(batch)
    leaves = jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]
    return {leaf_name(p): np.asarray(x) for p, x in leaves}


def metric_rows(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def agreed(rows: list[dict]) -> list[dict]:
    """A process's metric rows without its own clock's readings (phases, ``time``): the rest
    comes from process 0 and is identical everywhere."""
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def test_two_trainer_processes_run_the_loop_stop_together_and_resume(cluster):
    # -- first start: process 1 gets a notice after its 2nd step; both stop there -----------
    first = cluster.train(notice_after={1: 2})
    for pid, (status, err) in enumerate(first):
        assert status == 75, f"process {pid} exited {status}:\n{err[-4000:]}"
    assert "preempted" in first[0][1] and "trainer process 1: SIGTERM" in first[0][1]
    (a0, _), (a1, _) = cluster.record(0, 0), cluster.record(1, 0)
    assert len(a0["steps"]) == len(a1["steps"]) == 2
    assert agreed(a0["metrics"]) == agreed(a1["metrics"]) and len(a0["metrics"]) == 2
    assert [r["step"] for r in metric_rows(cluster.run_dir)] == [1, 2]  # written once
    saved = cluster.run_dir / "train_state"
    assert (saved / "2" / "crc32.json").is_file()  # both processes' shards, checksummed

    # -- second start: both restore step 2 and finish -----------------------------------------
    second = cluster.train()
    for pid, (status, err) in enumerate(second):
        assert status == 0, f"process {pid} exited {status}:\n{err[-4000:]}"
    assert all("resumed from" in out and "step 2" in out for _, out in second)
    (b0, _), (b1, _) = cluster.record(0, 1), cluster.record(1, 1)
    assert len(b0["steps"]) == len(b1["steps"]) == STEPS - 2
    assert agreed(b0["metrics"]) == agreed(b1["metrics"])
    rows = metric_rows(cluster.run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # steps start at 1
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        # On-policy: every group came from the version just pushed, so the worker pulled each
        # multi-part version; its logprobs are the trainer's: it pulled the weights exactly.
        assert r["groups_kept"] == r["staleness_0"] == PROMPTS
        assert r["mismatch_abs_logp"] < 1e-4, r

    # -- only process 0 took batches, and every prompt was taken exactly once -----------------
    assert a1["takes"] == [] and b1["takes"] == []
    taken = [p for take in a0["takes"] + b0["takes"] for p in take]
    assert len(taken) == len(set(taken)) == STEPS * PROMPTS

    # -- the final parameters: the same on both processes, and as one process would train ----
    names = b0["param_names"]
    p0, p1 = (np.load(cluster.out / f"params_{pid}.npz") for pid in range(2))
    got = {name: p0[f"arr_{i}"] for i, name in enumerate(names)}
    for i, name in enumerate(names):
        np.testing.assert_array_equal(p1[f"arr_{i}"], got[name], err_msg=name)
    assert b0["shards_equal_whole"] and b1["shards_equal_whole"]
    want = replay(global_batches(cluster, 0) + global_batches(cluster, 1))
    base = replay([])
    assert max(np.abs(want[n] - base[n]).max() for n in names) > 1e-3  # it did train
    for name in names:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0, err_msg=name)

    # -- the served version is the trainer's parameters, whole; so is the exported policy ------
    client = ParamServerClient(ServerSettings(address=cluster.address, token=TOKEN), retry_s=10)
    version, tensors, buf = client.pull()
    client.close()
    assert version == STEPS
    assert [t["name"] for t in tensors] == names
    for t in tensors:
        pulled = np.frombuffer(buf, np.float32, int(np.prod(t["shape"])), t["offset"])
        np.testing.assert_array_equal(pulled.reshape(t["shape"]), got[t["name"]], t["name"])
    assert json.loads((cluster.run_dir / "eval.json").read_text()).keys() == {"before", "after"}
    exported = nnx.state(load_model(cluster.run_dir / "checkpoint").model)
    for p, x in jax.tree_util.tree_flatten_with_path(exported)[0]:
        np.testing.assert_array_equal(np.asarray(x), got[leaf_name(p)], leaf_name(p))
