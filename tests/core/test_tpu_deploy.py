"""examples/deploy/tpu/: the TPU JobSet puts the trainer on one slice and the workers on
slices of their own, each pod asks for the chips its host has, the trainer's hosts agree
on their coordinator and count, and each worker's sampler mesh covers its chips.

Checked as the GPU manifests are (tests/core/test_multihost_deploy.py); not applied here.
"""

from __future__ import annotations

import math
import pathlib
import posixpath
import shutil

import gin
import pytest
import yaml

from rlax.core import config, plugins
from rlax.core.cli import ROLES
from rlax.core.parallel.inventory import TPU_GENERATIONS, Inventory
from rlax.core.parallel.mesh import MeshConfig
from rlax.core.parallel.multihost import DistributedSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"
TPU = DEPLOY / "tpu"
#: GKE's accelerator label -> the generation of rlax.core.parallel.inventory.
ACCELERATORS = {"tpu-v6e-slice": "v6e", "tpu-v5-lite-podslice": "v5e", "tpu-v4-podslice": "v4"}
#: (generation, chips of the slice) -> chips per VM, from Google's table of v6e slice shapes
#: (cloud.google.com/tpu/docs/v6e "Supported configurations": 2x2 is one ct6e-standard-4t
#: VM, 4x4 four of them).
CHIPS_PER_VM = {("v6e", 4): 4, ("v6e", 16): 4}


def jobset() -> dict:
    (doc,) = [d for d in yaml.safe_load_all((TPU / "jobset.yaml").read_text()) if d]
    assert (doc["apiVersion"], doc["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    return doc


def jobs() -> dict[str, dict]:
    return {r["name"]: r for r in jobset()["spec"]["replicatedJobs"]}


def pod(rjob: dict) -> dict:
    return rjob["template"]["spec"]["template"]["spec"]


def container(rjob: dict) -> dict:
    (c,) = pod(rjob)["containers"]
    return c


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def slice_of(rjob: dict) -> tuple[str, int, int]:
    """(generation, chips of the slice, chips a pod asks for) of a replicated job."""
    selector = pod(rjob)["nodeSelector"]
    generation = ACCELERATORS[selector["cloud.google.com/gke-tpu-accelerator"]]
    chips = math.prod(int(d) for d in selector["cloud.google.com/gke-tpu-topology"].split("x"))
    return generation, chips, container(rjob)["resources"]["limits"]["google.com/tpu"]


def test_the_trainer_has_one_slice_and_the_workers_slices_of_their_own():
    js, by_name = jobset(), jobs()
    assert set(by_name) == {"trainer", "workers"}
    assert by_name["trainer"]["replicas"] == 1 and by_name["workers"]["replicas"] >= 1
    annotations = js["metadata"]["annotations"]
    assert (
        annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"]
        == "cloud.google.com/gke-nodepool"
    )
    roles = {name: container(r)["command"] for name, r in by_name.items()}
    for name, cmd in roles.items():
        assert cmd[:3] == ["rlax", "run", "--gin"]
        assert cmd[cmd.index("--role") + 1] == {"trainer": "trainer", "workers": "worker"}[name]
        assert cmd[cmd.index("--role") + 1] in ROLES


@pytest.mark.parametrize("name", ["trainer", "workers"])
def test_each_pod_asks_for_its_host_s_chips_and_the_job_has_a_pod_per_host(name):
    rjob = jobs()[name]
    generation, chips, per_pod = slice_of(rjob)
    assert per_pod == CHIPS_PER_VM[(generation, chips)]
    assert per_pod <= TPU_GENERATIONS[generation].chips_per_host
    job = rjob["template"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == chips // per_pod
    # One process owns every chip of its host: a count a process may own.
    assert per_pod in Inventory("tpu", per_pod, generation).tpu.process_bounds


def test_the_trainer_hosts_find_their_coordinator_and_their_ids():
    js, rjob = jobset(), jobs()["trainer"]
    hosts = rjob["template"]["spec"]["completions"]
    c = container(rjob)
    env = env_of(c)
    assert int(env["RLAX_NUM_PROCESSES"]) == hosts
    host, port = env["RLAX_COORDINATOR"].rsplit(":", 1)
    subdomain = js["spec"]["network"]["subdomain"]
    assert host == f"{js['metadata']['name']}-trainer-0-0.{subdomain}"
    assert int(port) in {p["containerPort"] for p in c["ports"]}
    for index in range(hosts):
        s = DistributedSettings().resolved({**env, "JOB_COMPLETION_INDEX": str(index)})
        assert (s.num_processes, s.process_id) == (hosts, index)


def test_every_pod_reaches_the_parameter_server_with_the_secret_token_and_the_config():
    (service,) = [
        d
        for d in yaml.safe_load_all((DEPLOY / "param-server.yaml").read_text())
        if d and d["kind"] == "Service"
    ]
    address = f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    for rjob in jobs().values():
        c, spec = container(rjob), pod(rjob)
        env = env_of(c)
        assert env["RLAX_PS_ADDRESS"] == address and "RLAX_PS_TOKEN" not in env
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        token = volumes[mounts[posixpath.dirname(env["RLAX_PS_TOKEN_FILE"])]]
        assert token["secret"]["secretName"] == "rlax-token"
        gin_file = c["command"][c["command"].index("--gin") + 1]
        assert volumes[mounts[posixpath.dirname(gin_file)]]["configMap"]["name"] == "rlax-config"
        assert posixpath.basename(gin_file) == "tpu.gin"


@pytest.fixture
def config_map(tmp_path):
    """The ConfigMap's directory: cluster.gin and tpu.gin, side by side."""
    shutil.copy(DEPLOY / "cluster.gin", tmp_path / "cluster.gin")
    shutil.copy(TPU / "tpu.gin", tmp_path / "tpu.gin")
    return tmp_path


def test_a_worker_s_sampler_mesh_covers_its_slice_s_chips(config_map):
    pm = plugins.build_plugin_manager()
    config.register_core_configurables()
    config.parse([config_map / "tpu.gin"], plugins=pm)
    try:
        mesh = gin.query_parameter("samplers.jax.mesh").scoped_configurable_fn()
    finally:
        gin.clear_config()
    _, chips, per_pod = slice_of(jobs()["workers"])
    assert isinstance(mesh, MeshConfig)
    sizes = mesh.shape(per_pod)
    assert math.prod(sizes) == per_pod == chips
    assert (mesh.data, mesh.fsdp, mesh.tensor) == (1, 1, -1)  # tensor parallel over all
