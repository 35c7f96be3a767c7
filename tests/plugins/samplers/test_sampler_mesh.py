"""Both samplers over a 4-device mesh (8 fake CPU devices in a subprocess, the sampler on
devices 4-7): the one-device sampler's tokens, its logprobs to 1e-5 (fp32), no program
compiled after the first call, and the weights and KV caches split across the 4 devices."""

from __future__ import annotations

import pathlib

import pytest
from device_checks import script_on_devices

pytestmark = pytest.mark.e2e

CHECKS = pathlib.Path(__file__).with_name("sampler_mesh_checks.py")
CASES = [f"{s}/{m}" for s in ("jax", "engine") for m in ("tensor4", "data2_tensor2")]
CASES.append("jax/devices_only")  # devices given, no mesh setting: tensor parallel


@pytest.fixture(scope="module")
def results():
    return script_on_devices(CHECKS)


@pytest.mark.parametrize("case", CASES)
def test_a_sharded_sampler_samples_as_one_device_does(results, case):
    got = results[case]
    assert got["tokens_equal"]
    assert got["max_logprob_diff"] <= 1e-5


@pytest.mark.parametrize("case", CASES)
def test_a_sharded_sampler_compiles_nothing_after_warm_up(results, case):
    got = results[case]
    assert got["compiles_warm"] >= 1
    assert got["compiles_after"] == got["compiles_warm"]


@pytest.mark.parametrize("case", CASES)
def test_every_sampler_device_holds_part_of_the_weights_and_caches(results, case):
    got = results[case]
    assert got["devices"] == [4, 5, 6, 7]
    assert got["split_leaves"] > 0
    assert got["shards_of_a_split_leaf"] == (2 if case.endswith("data2_tensor2") else 4)
    assert got["caches_split"]
