"""Two local trainer processes under ``jax.distributed.initialize`` (4 fake CPU devices each)
end with the parameters of one process running the same steps, and their weight
push pulls back whole and equal."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from rlax.core.parallel import multihost as distributed
from rlax.core.parallel.mesh import MeshConfig, make_mesh
from rlax.core.trainer import publish_shards
from rlax.core.wire import WirePlan, leaf_name

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import multihost_case as case
from cli_runs import fake_devices

sys.path.remove(str(HERE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(out: pathlib.Path, ps=None) -> None:
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, XLA_FLAGS=fake_devices(4), JAX_PLATFORMS="cpu")
    extra = [ps.settings.address, ps.settings.token] if ps is not None else []
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "multihost_worker.py"),
                str(pid),
                "2",
                coordinator,
                str(out),
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for pid, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"process {pid} exited {p.returncode}:\n{log[-6000:]}"


def load_shards(out: pathlib.Path) -> tuple[list[publish_shards.LocalShard], list[dict]]:
    shards, metas = [], []
    for pid in range(2):
        meta = json.loads((out / f"meta_{pid}.json").read_text())
        data = np.load(out / f"shards_{pid}.npz")
        for i, m in enumerate(meta["shards"]):
            shards.append(
                publish_shards.LocalShard(
                    m["name"], m["index"], tuple(m["shape"]), tuple(m["start"]), data[str(i)]
                )
            )
        metas.append(meta)
    return shards, metas


@pytest.fixture(scope="module")
def single_process_run():
    trainer = case.trainer(mesh=None)
    metrics = [trainer.step(case.batch(s)) for s in range(case.STEPS)]
    params = {
        leaf_name(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]
    }
    return params, metrics, WirePlan.for_tree(trainer.state.params)


def test_process_rows_cover_the_batch_once():
    # On 8 fake devices the rows of process 0 and 1 would be disjoint halves; with this
    # process's single device, process 0 feeds every row.
    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    assert distributed.process_rows(mesh, 6).tolist() == [0, 1, 2, 3, 4, 5]
    assert distributed.process_rows(mesh, 6, process=1).tolist() == []


@pytest.mark.e2e
def test_two_processes_equal_one_and_their_push_pulls_back_whole(
    tmp_path, make_ps, single_process_run
):
    ps = make_ps()
    run_two_processes(tmp_path, ps)
    shards, metas = load_shards(tmp_path)
    # Each process fed its own half of the rows; together, each row once.
    rows = [m["rows"] for m in metas]
    assert sorted(rows[0] + rows[1]) == list(range(case.ROWS)) and len(rows[0]) == case.ROWS // 2
    # The full rows ran in the budget's layout: 2 microbatches of 8 global rows, 8 rows fed
    # by each process. The short ones: each process's 8 sequences of 3 tokens fill 2 rows of
    # 12, 4 in all, at most half of 8: one microbatch of 4 rows, 2 fed by each process.
    for m in metas:
        assert m["packed_rows"] == [8] * (case.STEPS - 1) + [2]
    # The shards of both processes tile every tensor exactly once (replicas pushed once).
    want, want_metrics, plan = single_process_run
    assert {s.name for s in shards} == set(want)
    covered = {name: 0 for name in want}
    for s in shards:
        covered[s.name] += s.data.size
    assert covered == {name: x.size for name, x in want.items()}
    assert {s.name for s in shards if s.data.shape != s.shape}  # something really is sharded
    # Same parameters and metrics as one process running the same steps.
    got = publish_shards.assemble(shards)
    for name, x in want.items():
        np.testing.assert_allclose(got[name], x, atol=1e-5, rtol=0, err_msg=name)
    for m in metas:
        for step, (a, b) in enumerate(zip(m["metrics"], want_metrics, strict=True)):
            for k in b:
                assert a[k] == pytest.approx(b[k], abs=1e-5), (step, k)
    # Both pushed their part of version 1; the second completed it. A pull gets whole tensors.
    pushes = [json.loads((tmp_path / f"push_{pid}.json").read_text()) for pid in range(2)]
    assert {p["version"] for p in pushes} == {1} and sum(p["committed"] for p in pushes) == 1
    version, tensors, buf = ps.client.pull()
    assert version == 1
    pulled = {
        t["name"]: np.frombuffer(buf, np.float32, int(np.prod(t["shape"])), t["offset"]).reshape(
            t["shape"]
        )
        for t in tensors
    }
    assert [t["name"] for t in tensors] == list(want)  # the model's order
    plan.check_layout(tensors)  # what a worker checks: the layout of a whole-model push
    for name, x in got.items():
        np.testing.assert_array_equal(pulled[name], x, err_msg=name)
