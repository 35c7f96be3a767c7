"""The weight-load check in a whole run (issue 53 item 2): `rlax run` with the parameter
server, the trainer and two workers as processes, where worker-0's load of version 2 is
corrupted after the transfer's checksums passed. Worker-0 refuses it (an error line, the
trainer's ``probe_refused`` metric), submits nothing sampled with it, and the run ends."""

from __future__ import annotations

import json
import re

import pytest
from cli_runs import CLUSTER_STEPS, quickstart_cluster, rlax_process

pytestmark = pytest.mark.e2e

# A test plugin: in worker-0's process only, its hook (called when plugins load) wraps the
# worker's unpacking of a pulled version, which runs after every checksum was checked.
# "flip" scrambles the embedding's bytes; "stale" puts the previous version's bytes in the
# buffer, so version 2's number and probe arrive with version 1's tensors. The worker logs
# the versions it submits groups of, for the test to read.
CORRUPTS_WEIGHTS = """
import os

import numpy as np

from rlax.core import hookimpl
from rlax.core.worker import role

MODE = os.environ["CORRUPT_MODE"]
kept = {}


def corrupting(unpacked):
    def unpack(plan, tensors, buffer, adapters):
        version = role.Worker.pulling
        view = np.frombuffer(buffer, np.uint8)
        view.setflags(write=True)
        if version >= 2 and not role.Worker.corrupted:
            role.Worker.corrupted = True
            print(f"corrupts_weights: worker-0 corrupts version {version}", flush=True)
            if MODE == "flip":  # every float32's high byte of the embedding
                t = next(t for t in tensors if "embed" in t["name"])
                view[t["offset"] + 3 : t["offset"] + t["nbytes"] : 4] ^= 0x40
            else:  # the previous version's bytes under this version's number and probe
                view[:] = kept[max(kept)]
        else:
            kept.clear()
            kept[version] = view.copy()
        return unpacked(plan, tensors, buffer, adapters)

    return unpack


@hookimpl
def rlax_register_rewards():
    if os.environ.get("RLAX_WORKER_ID") == "worker-0" and not hasattr(role.Worker, "pulling"):
        role.Worker.pulling, role.Worker.corrupted = -1, False
        pull = role.ParamServerClient.pull

        def noting(self, have_version=-1):
            pulled = pull(self, have_version)
            role.Worker.pulling = pulled[0] if pulled else -1
            return pulled

        role.ParamServerClient.pull = noting
        role.unpacked = corrupting(role.unpacked)
        submit = role.ParamServerClient.submit

        def telling(self, group, lease_id, *, filtered=False):
            versions = sorted({c.policy_version for c in group.completions})
            print(f"corrupts_weights: worker-0 submits versions {versions}", flush=True)
            return submit(self, group, lease_id, filtered=filtered)

        role.ParamServerClient.submit = telling
    return {}
"""


@pytest.mark.parametrize("mode", ["flip", "stale"])
def test_a_corrupted_load_is_refused_and_the_run_finishes(tmp_path, mode):
    (tmp_path / "corrupts_weights.py").write_text(CORRUPTS_WEIGHTS)
    run_dir = tmp_path / "run"
    proc = rlax_process(
        *quickstart_cluster(
            CLUSTER_STEPS,
            "--gin.MAX_STALENESS=1",  # worker-1 carries the run while worker-0 waits
            "--gin.rlax.param_server.lease_ttl_s=10.0",  # worker-0's unsampled leases return
            # One quickstart update moves the probe by ~0.02 nats (the default 0.01 sees
            # that, with a margin of 2): 1e-3 keeps "stale" far from the edge, and every
            # honest load of the run still passes it (one refusal in all).
            "--gin.rlax.worker.probe_tolerance=0.001",
        ),
        "-p",
        "corrupts_weights",
        "--run-dir",
        str(run_dir),
        env={"PYTHONPATH": str(tmp_path), "CORRUPT_MODE": mode},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, CLUSTER_STEPS + 1))  # it finished
    bad = int(re.search(r"worker-0 corrupts version (\d+)", out)[1])
    assert re.search(rf"worker-0: weight-load check refused version {bad}: .* differ", out)
    assert out.count("weight-load check refused") == 1  # only the corrupted load
    assert max(r["probe_refused"] for r in rows) == 1  # the trainer's metric counts it
    submitted = [json.loads(v) for v in re.findall(r"worker-0 submits versions (\[.*\])", out)]
    assert submitted and all(bad not in versions for versions in submitted)
