"""The device-to-device handoff (8 fake CPU devices in a subprocess: the trainer's weights
on devices 0-3, the sampler's on 4-7, or colocated on 0-3), against a real parameter
server: a handed-over version equals what a pull of it gives (float32 and the bf16
wire's rounding), sits on the sampler's devices in the sampler's own layout, is what the
sampler loads (no second placement), outlives the trainer's donated arrays, and costs no
pull; a version the handoff does not hold is pulled as bytes, as any worker does."""

from __future__ import annotations

import pathlib

import pytest
from device_checks import script_on_devices

pytestmark = pytest.mark.e2e

CHECKS = pathlib.Path(__file__).with_name("handoff_checks.py")
CASES = ("one_process", "one_process_bf16", "colocated")


@pytest.fixture(scope="module")
def results():
    return script_on_devices(CHECKS)


@pytest.mark.parametrize("case", CASES)
def test_a_handed_over_version_equals_its_pull_and_costs_no_pull(results, case):
    got = results[case]
    assert (got["v0_version"], got["v0_pulls"]) == (0, 0)
    assert got["v0_equals_pulled"]
    assert got["v0_differs_from_trainer"] == (case == "one_process_bf16")  # rounded as the wire


@pytest.mark.parametrize("case", CASES)
def test_it_lands_on_the_samplers_devices_in_the_samplers_layout(results, case):
    got = results[case]
    assert got["v0_devices"] == ([0, 1, 2, 3] if case == "colocated" else [4, 5, 6, 7])
    assert got["v0_sharding_is_samplers"]
    assert got["v0_loaded_as_handed"]  # load_weights placed nothing again
    assert got["alive_after_donation"]  # a copy, even on the trainer's own devices


@pytest.mark.parametrize("case", CASES)
def test_a_version_not_offered_is_pulled_and_the_next_offered_one_is_not(results, case):
    got = results[case]
    assert (got["v1_version"], got["v1_pulls"]) == (1, 1)
    assert (got["v2_version"], got["v2_pulls"]) == (2, 1)
    assert got["v2_equals_pulled"]
    assert got["v2_metrics"] == ["handoff_s", "weight_sync_s"]
    assert (got["taken"], got["refused"]) == (3, 1)  # v0 (twice: the test's look), v2; v1
