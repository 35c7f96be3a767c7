"""Runs ``context_checks.py`` on 8 fake CPU devices in a subprocess, once per module.

The main pytest process has JAX started with one device, so the context-parallel
checks run in their own interpreter; each of their test functions is reported here as
one test that fails unless every case of it passed (a skip is a failure).
"""

from __future__ import annotations

import pathlib

import pytest
from device_checks import assert_passed, check_names, pytest_on_devices

pytestmark = pytest.mark.e2e

CHECKS = pathlib.Path(__file__).with_name("context_checks.py")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    report_dir = tmp_path_factory.mktemp("context")
    return pytest_on_devices(CHECKS, report_dir, timeout=900, cwd=CHECKS.parent)


@pytest.mark.parametrize("name", check_names(CHECKS))
def test_on_eight_devices(outcomes, name):
    assert_passed(outcomes, name)
