"""examples/deploy/: the Kubernetes manifests parse, start each role once, and agree on addresses.

Not run on a cluster here; these checks catch what breaks a deployment before
it is applied: a role name the CLI does not know, a Service that selects no
pod or the wrong port, a coordinator address no trainer pod has, a process
count that is not the number of trainer hosts, a gin file that does not parse
from the ConfigMap's flat directory.
"""

from __future__ import annotations

import pathlib
import posixpath
import shutil

import gin
import pytest
import yaml

from rlax.core import config, plugins
from rlax.core.cli import ROLES
from rlax.core.parallel.mesh import AXES, MeshConfig
from rlax.core.parallel.multihost import DistributedSettings
from rlax.core.trainer.step import TrainerSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"


def documents() -> list[dict]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for d in documents() if d["kind"] == kind]


def pod_specs() -> dict[str, dict]:
    """name -> pod template (metadata + spec) of every workload."""
    pods = {}
    for d in by_kind("Deployment"):
        pods[d["metadata"]["name"]] = d["spec"]["template"]
    for js in by_kind("JobSet"):
        for rjob in js["spec"]["replicatedJobs"]:
            pods[f"{js['metadata']['name']}-{rjob['name']}"] = rjob["template"]["spec"]["template"]
    return pods


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def role_of(container: dict) -> str:
    cmd = container["command"]
    assert cmd[:3] == ["rlax", "run", "--gin"], cmd
    assert "--role" in cmd, cmd
    return cmd[cmd.index("--role") + 1]


def containers() -> list[tuple[dict, dict]]:
    return [(pod, c) for pod in pod_specs().values() for c in pod["spec"]["containers"]]


def test_manifests_have_the_expected_kinds():
    kinds = {(d["apiVersion"], d["kind"]) for d in documents()}
    assert kinds == {
        ("v1", "Service"),
        ("apps/v1", "Deployment"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    }


def test_each_role_runs_once_with_a_role_the_cli_knows():
    roles = sorted(role_of(c) for _, c in containers())
    assert roles == ["param_server", "trainer", "worker"]
    assert set(roles) <= set(ROLES)
    for pod, c in containers():
        gin_file = c["command"][c["command"].index("--gin") + 1]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        # The gin file lives in the rlax-config ConfigMap, mounted where the command reads it.
        volume = volumes[mounts[posixpath.dirname(gin_file)]]
        assert volume["configMap"]["name"] == "rlax-config"
        assert posixpath.basename(gin_file) == "cluster.gin"


def test_the_service_reaches_the_parameter_server_and_everyone_uses_it():
    (service,) = by_kind("Service")
    (ps_pod,) = [p for p, c in containers() if role_of(c) == "param_server"]
    (ps,) = ps_pod["spec"]["containers"]
    labels = ps_pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    container_port = {p["name"]: p["containerPort"] for p in ps["ports"]}[port["targetPort"]]
    # The server binds every interface of its pod on that port (loopback is the default).
    assert env_of(ps)["RLAX_PS_ADDRESS"] == f"0.0.0.0:{container_port}"
    address = f"{service['metadata']['name']}:{port['port']}"
    for _, c in containers():
        if role_of(c) != "param_server":
            assert env_of(c)["RLAX_PS_ADDRESS"] == address, role_of(c)


def test_every_pod_reads_the_token_from_the_secret():
    for pod, c in containers():
        token_file = env_of(c)["RLAX_PS_TOKEN_FILE"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert (
            volumes[mounts[posixpath.dirname(token_file)]]["secret"]["secretName"] == "rlax-token"
        )
        assert "RLAX_PS_TOKEN" not in env_of(c)  # no secret in a manifest


def test_trainer_hosts_find_their_coordinator_and_their_ids():
    (js,) = by_kind("JobSet")
    (rjob,) = js["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert rjob["replicas"] == 1 and job["completionMode"] == "Indexed"
    hosts = job["completions"]
    assert job["parallelism"] == hosts
    (c,) = job["template"]["spec"]["containers"]
    env = env_of(c)
    assert int(env["RLAX_NUM_PROCESSES"]) == hosts
    network = js["spec"]["network"]
    assert network["enableDNSHostnames"] is True
    subdomain = network.get("subdomain", js["metadata"]["name"])
    host, port = env["RLAX_COORDINATOR"].rsplit(":", 1)
    # JobSet's name for pod 0 of job 0: <jobset>-<replicated job>-<job index>-<pod index>.
    assert host == f"{js['metadata']['name']}-{rjob['name']}-0-0.{subdomain}"
    assert int(port) in {p["containerPort"] for p in c["ports"]}
    # Each host's process id is its completion index, which Kubernetes puts in the env.
    for index in range(hosts):
        s = DistributedSettings().resolved({**env, "JOB_COMPLETION_INDEX": str(index)})
        assert (s.coordinator, s.num_processes, s.process_id) == (
            env["RLAX_COORDINATOR"],
            hosts,
            index,
        )


@pytest.fixture
def config_map(tmp_path):
    """The ConfigMap's directory: cluster.gin alone (it includes the packaged quickstart)."""
    shutil.copy(DEPLOY / "cluster.gin", tmp_path / "cluster.gin")
    return tmp_path


def test_cluster_gin_parses_and_lays_out_the_trainer(config_map):
    pm = plugins.build_plugin_manager()
    config.register_core_configurables()
    config.parse([config_map / "cluster.gin"], plugins=pm)
    try:
        spec = config.build_spec(pm)  # what every role of the deployment takes
        base = gin.query_parameter("INIT_CHECKPOINT/gin.macro.value")
    finally:
        gin.clear_config()
    mesh, settings, dist = spec.train.mesh, spec.train.trainer_settings, spec.train.distributed
    assert isinstance(mesh, MeshConfig)
    assert dict(zip(AXES, mesh.shape(16), strict=True)) == {
        "data": 1,
        "fsdp": 16,
        "context": 1,
        "tensor": 1,
        "expert": 1,
    }
    assert isinstance(settings, TrainerSettings) and settings.compute_dtype == "bfloat16"
    assert isinstance(dist, DistributedSettings)
    # The ConfigMap holds cluster.gin alone: quickstart.gin and its base policy are the package's.
    assert pathlib.Path(base, "model.json").is_file()
    assert pathlib.Path(base).parent.name == "assets"
