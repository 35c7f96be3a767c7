"""Placement on hand-written hosts: each child's environment equals a table written by hand,
impossible placements are refused in one line naming the setting and what is possible, and
none of it imports JAX or opens a device."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from rlax.core.errors import BadSetting
from rlax.core.parallel.inventory import Inventory, detect_inventory
from rlax.core.parallel.placement import Placement, place_roles
from rlax.core.parallel.process_env import ChildDevices, child_environments, plan_children

GIB = 2**30
CPU4 = Inventory("cpu", cpu_cores=(0, 1, 2, 3))
GPU1 = Inventory("gpu", 1, "NVIDIA H100 80GB HBM3", 80 * GIB)
GPU2 = Inventory("gpu", 2, "NVIDIA H100 80GB HBM3", 80 * GIB)
# Eight GPUs seen through CUDA_VISIBLE_DEVICES: the host's ids are not 0..7.
GPU8 = Inventory(
    "gpu", 8, "NVIDIA A100-SXM4-40GB", 40 * GIB, device_ids=(8, 9, 10, 11, 12, 13, 14, 15)
)
V4 = Inventory("tpu", 4, "v4", 32 * 10**9)
V5E4 = Inventory("tpu", 4, "v5e", 16 * 10**9)
V6E8 = Inventory("tpu", 8, "v6e", 32 * 10**9)

SERVER = ChildDevices({"JAX_PLATFORMS": "cpu"})
GPU_SERVER = ChildDevices({"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""})


def gpu(ids: str) -> ChildDevices:
    return ChildDevices(
        {
            "CUDA_VISIBLE_DEVICES": ids,
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
            "XLA_CLIENT_MEM_FRACTION": "0.9",
        }
    )


def tpu(chips: str, bounds: str, port: int) -> ChildDevices:
    return ChildDevices(
        {
            "TPU_CHIPS_PER_PROCESS_BOUNDS": bounds,
            "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_VISIBLE_CHIPS": chips,
            "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}",
            "TPU_MESH_CONTROLLER_PORT": str(port),
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        }
    )


# (host, placement, workers) -> (mode, {child: what it is given}), written by hand.
TABLE = {
    "cpu, cores pinned": (
        (CPU4, Placement(trainer_cores=(0, 1), worker_cores=(2, 3)), 2),
        "processes",
        {
            "param_server": SERVER,
            "trainer": ChildDevices({}, (0, 1)),
            "worker-0": ChildDevices({}, (2, 3)),
            "worker-1": ChildDevices({}, (2, 3)),
        },
    ),
    "1 gpu: colocated": (
        (GPU1, Placement(), 2),
        "colocated",
        {"param_server": GPU_SERVER, "trainer": gpu("0")},
    ),
    "2 gpus, 1 worker: one gpu each": (
        (GPU2, Placement(), 1),
        "processes",
        {"param_server": GPU_SERVER, "trainer": gpu("0"), "worker-0": gpu("1")},
    ),
    "2 gpus, 2 workers: one process, two meshes": (
        (GPU2, Placement(), 2),
        "one_process",
        {"param_server": GPU_SERVER, "trainer": gpu("0,1")},
    ),
    "8 gpus, 2 workers: host ids": (
        (GPU8, Placement(), 2),
        "processes",
        {
            "param_server": GPU_SERVER,
            "trainer": gpu("8,9,10,11"),
            "worker-0": gpu("12,13"),
            "worker-1": gpu("14,15"),
        },
    ),
    "8 gpus, trainer 6, sampler 2, 2 workers": (
        (GPU8, Placement(trainer=6), 2),
        "processes",
        {
            "param_server": GPU_SERVER,
            "trainer": gpu("8,9,10,11,12,13"),
            "worker-0": gpu("14"),
            "worker-1": gpu("15"),
        },
    ),
    "v4 4 chips, 1 worker: 2-chip blocks": (
        (V4, Placement(), 1),
        "processes",
        {
            "param_server": SERVER,
            "trainer": tpu("0,1", "1,2,1", 8476),
            "worker-0": tpu("2,3", "1,2,1", 8477),
        },
    ),
    "v4 4 chips, 2 workers: 1 chip each": (
        (V4, Placement(), 2),
        "processes",
        {
            "param_server": SERVER,
            "trainer": tpu("0,1", "1,2,1", 8476),
            "worker-0": tpu("2", "1,1,1", 8477),
            "worker-1": tpu("3", "1,1,1", 8478),
        },
    ),
    "v5e 4 chips: 2+2 may not be processes, so one process owns all": (
        (V5E4, Placement(), 1),
        "one_process",
        {"param_server": SERVER, "trainer": ChildDevices({})},
    ),
    "v6e 8 chips, 1 worker: 4-chip blocks": (
        (V6E8, Placement(), 1),
        "processes",
        {
            "param_server": SERVER,
            "trainer": tpu("0,1,2,3", "2,2,1", 8476),
            "worker-0": tpu("4,5,6,7", "2,2,1", 8477),
        },
    ),
    "v6e 8 chips, 2 workers: 2-chip workers impossible, one process": (
        (V6E8, Placement(), 2),
        "one_process",
        {"param_server": SERVER, "trainer": ChildDevices({})},
    ),
    "v6e 8 chips, one process on half the host": (
        (V6E8, Placement(mode="one_process", trainer=2, sampler=2), 2),
        "one_process",
        {
            "param_server": SERVER,
            "trainer": ChildDevices(
                {
                    "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
                    "TPU_PROCESS_BOUNDS": "1,1,1",
                    "TPU_VISIBLE_CHIPS": "0,1,2,3",
                    "TPU_MESH_CONTROLLER_ADDRESS": "localhost:8476",
                    "TPU_MESH_CONTROLLER_PORT": "8476",
                }
            ),
        },
    ),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_each_child_gets_the_hand_written_environment(case):
    (host, placement, workers), mode, expected = TABLE[case]
    roles = place_roles(host, placement, workers=workers)
    assert roles.mode == mode
    assert child_environments(host, roles) == expected


def test_the_default_splits_trainer_and_sampler_in_halves_on_2_4_and_8_devices():
    for n in (2, 4, 8):
        host = Inventory("gpu", n, "gpu")
        roles = place_roles(host, Placement(), workers=1)
        assert roles.trainer == tuple(range(n // 2))
        assert roles.sampler == tuple(range(n // 2, n))
        assert set(roles.trainer).isdisjoint(roles.sampler)
    one = place_roles(Inventory("gpu", 1, "gpu"), Placement(), workers=4)
    assert (one.mode, one.trainer, one.sampler) == ("colocated", (0,), (0,))


# (host, placement, workers) -> (the setting named, words the message must hold)
REFUSED = {
    "v6e: a 2-chip process": (
        (V6E8, Placement(mode="processes", trainer=2, sampler=4), 1),
        "trainer",
        "may own 1, 4 or 8 chips",
    ),
    "v5e: 2-chip workers": (
        (V5E4, Placement(mode="processes"), 1),
        "trainer",
        "may own 1 or 4 chips",
    ),
    "v6e: chips not one block": (
        (V6E8, Placement(mode="processes", trainer=(1, 2, 3, 4)), 1),
        "trainer",
        "blocks of 4: 0-3, 4-7",
    ),
    "two processes on one chip": (
        (V4, Placement(mode="processes", trainer=(0, 1), sampler=(1, 2)), 1),
        "sampler",
        "only mode='colocated' shares",
    ),
    "two processes on one gpu": (
        (GPU2, Placement(mode="processes", trainer=(0,), sampler=(0,)), 1),
        "sampler",
        "only mode='colocated' shares",
    ),
    "a device the host lacks": (
        (GPU8, Placement(trainer=(7, 8)), 1),
        "trainer",
        "the host has 8 gpu devices (0..7)",
    ),
    "a device twice": ((GPU8, Placement(sampler=(5, 5)), 1), "sampler", "twice"),
    "more devices than free": (
        (GPU2, Placement(trainer=1, sampler=2), 1),
        "sampler",
        "1 of the host's 2 are free",
    ),
    "workers do not divide": (
        (GPU8, Placement(mode="processes"), 3),
        "sampler",
        "possible: 1, 2, 4 workers, or mode='one_process'",
    ),
    "trainer takes all": (
        (GPU2, Placement(mode="processes", trainer=2), 1),
        "trainer",
        "leaves the sampler none",
    ),
    "colocated on different devices": (
        (GPU2, Placement(mode="colocated", trainer=(0,), sampler=(1,)), 1),
        "sampler",
        "share their devices",
    ),
    "one process of 6 v6e chips": (
        (V6E8, Placement(mode="one_process", trainer=4, sampler=2), 1),
        "mode",
        "may own 1, 4 or 8 chips",
    ),
    "devices on a cpu host": ((CPU4, Placement(trainer=1), 1), "trainer", "no accelerator"),
    "a core the machine lacks": (
        (CPU4, Placement(worker_cores=(2, 9)), 1),
        "worker_cores",
        "core 9",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_impossible_placement_is_refused_in_one_line_naming_the_setting(case):
    (host, placement, workers), setting, words = REFUSED[case]
    with pytest.raises(BadSetting) as err:
        place_roles(host, placement, workers=workers)
    assert err.value.parameter == setting
    assert words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        ({"mode": "pipelined"}, "mode"),
        ({"trainer": 0}, "trainer"),
        ({"gpu_memory_fraction": 1.5}, "gpu_memory_fraction"),
    ],
)
def test_a_bad_placement_value_is_refused_when_made(kwargs, setting):
    with pytest.raises(BadSetting) as err:
        Placement(**kwargs)
    assert err.value.parameter == setting


def test_one_process_numbers_its_roles_devices_as_it_sees_them():
    roles = place_roles(
        GPU8, Placement(mode="one_process", trainer=(4, 5), sampler=(6, 7)), workers=2
    )
    (trainer,) = [c for n, c in child_environments(GPU8, roles).items() if n == "trainer"]
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "12,13,14,15"  # the host's ids of 4..7
    assert roles.in_process() == ((0, 1), (2, 3))  # jax.devices() of that process
    colocated = place_roles(GPU2, Placement(mode="colocated"), workers=1)
    assert colocated.in_process() == ((0, 1), (0, 1))


def test_the_supervisor_s_one_call_places_and_gives_environments():
    roles, children = plan_children(Placement(), workers=1, inventory=V6E8)
    assert roles == place_roles(V6E8, Placement(), workers=1)
    assert children == child_environments(V6E8, roles)
    with pytest.raises(BadSetting):
        plan_children(Placement(mode="processes", trainer=2), workers=1, inventory=V6E8)


def test_every_tpu_process_owns_distinct_chips_and_ports():
    roles = place_roles(V4, Placement(), workers=2)
    children = child_environments(V4, roles)
    chips = [c.env["TPU_VISIBLE_CHIPS"] for n, c in children.items() if n != "param_server"]
    ports = [c.env["TPU_MESH_CONTROLLER_PORT"] for n, c in children.items() if n != "param_server"]
    assert sorted(",".join(chips).split(",")) == ["0", "1", "2", "3"]
    assert len(set(ports)) == len(ports) == 3


# -- inventory: learnt from the operating system -------------------------------------------


def _pci(root, name, vendor, device):
    path = root / "bus" / "pci" / "devices" / name
    path.mkdir(parents=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "device").write_text(device + "\n")


def test_tpu_chips_are_counted_from_sysfs(tmp_path):
    for i in range(8):
        _pci(tmp_path, f"0000:00:0{i}.0", "0x1ae0", "0x006f")
    _pci(tmp_path, "0000:00:1f.0", "0x8086", "0x1234")  # not Google's
    _pci(tmp_path, "0000:00:1e.0", "0x1ae0", "0x0001")  # Google's, not a TPU
    inv = detect_inventory(env={}, sys_root=tmp_path, run=lambda argv: "", cpu_cores=[0, 1])
    assert inv == Inventory("tpu", 8, "v6e", 32 * 10**9, (0, 1))


SMI = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n"


def test_gpus_come_from_nvidia_smi_and_honour_cuda_visible_devices(tmp_path):
    asked = []

    def run(argv):
        asked.append(list(argv))
        return SMI

    inv = detect_inventory(env={}, sys_root=tmp_path, run=run, cpu_cores=[0])
    assert asked == [
        ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
    ]
    assert inv == Inventory("gpu", 2, "NVIDIA H100 80GB HBM3", 81559 * 2**20, (0,), (0, 1))
    only = detect_inventory(
        env={"CUDA_VISIBLE_DEVICES": "1"}, sys_root=tmp_path, run=run, cpu_cores=[0]
    )
    assert (only.count, only.ids) == (1, (1,))


def test_the_real_runner_calls_nvidia_smi_on_the_path(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '{SMI}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    inv = detect_inventory(env={}, sys_root=tmp_path, cpu_cores=[0])
    assert (inv.platform, inv.count) == ("gpu", 2)


def test_jax_platforms_cpu_wins_and_no_accelerator_is_cpu(tmp_path):
    _pci(tmp_path, "0000:00:04.0", "0x1ae0", "0x005e")
    forced = detect_inventory(
        env={"JAX_PLATFORMS": "cpu"}, sys_root=tmp_path, run=lambda a: SMI, cpu_cores=[3]
    )
    assert forced == Inventory("cpu", cpu_cores=(3,))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        detect_inventory(env={}, sys_root=empty, run=lambda a: "", cpu_cores=[0, 2]).platform
        == "cpu"
    )


def test_an_explicit_inventory_is_checked():
    with pytest.raises(ValueError, match="inventory.kind"):
        Inventory("tpu", 4, "v9z")
    with pytest.raises(ValueError, match="inventory.count"):
        Inventory("gpu", 0)


def test_placing_and_detecting_import_no_jax():
    code = (
        "import sys\n"
        "from rlax.core.parallel.inventory import detect_inventory\n"
        "from rlax.core.parallel.placement import Placement, place_roles\n"
        "from rlax.core.parallel.process_env import child_environments\n"
        "inv = detect_inventory()\n"
        "child_environments(inv, place_roles(inv, Placement(), workers=2))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'numpy')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
