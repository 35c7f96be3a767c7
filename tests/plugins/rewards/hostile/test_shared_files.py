"""Runs share nothing the kernel keeps: no answer crosses between concurrent runs.

Each pair of ``shared_files.py`` is scored at once by a reward pool of two
workers (one call each), so sender and receiver run at the same time; both
must score 0. The receivers' 1 would need the token (``shared_files.py``);
the control pair proves the pool overlaps the two runs: a receiver that takes
the token from the wall clock's overlap alone (both runs alive at once, seen
through nothing but time) would be timed by the same pool.
"""

from __future__ import annotations

import os
import pathlib
import platform
import runpy
import time

import numpy as np
import pytest

from rlax.core.rollout.reward_pool import RewardPool
from rlax.core.types import Prompt
from rlax.plugins.rewards.code.verifier import CodeReward
from rlax.plugins.rewards.sandbox import commands

pytestmark = pytest.mark.skipif(
    os.name != "posix" or platform.machine() != "x86_64",
    reason="the sandbox needs Linux; the programs use x86-64 call numbers",
)

HERE = pathlib.Path(__file__).parent
CASES = runpy.run_path(str(HERE / "cases.py"))
SHARED = runpy.run_path(str(HERE / "shared_files.py"))
PAIRS, SENDERS, RECEIVERS = SHARED["PAIRS"], SHARED["SENDERS"], SHARED["RECEIVERS"]
LIMITS = {**CASES["LIMITS"], "wall_s": 5.0, "cpu_s": 4}
ADD = CASES["TESTS"]["add"]


def prompt() -> Prompt:
    return Prompt(id="add", text="", tokens=np.zeros(1, np.int32), answer=ADD)


def fenced(source: str) -> str:
    return f"```python\n{source}```"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(CodeReward(**LIMITS), workers=2, prefetch=1, timeout_s=60.0) as pool:
        yield pool


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_the_pool_runs_a_pair_at_the_same_time(pool):
    """Two programs that each sleep 2 s take about 2 s together, not 4: they overlap."""
    sleeper = fenced("import time\ntime.sleep(2)\ndef add(a, b):\n    return a + b\n")
    start = time.monotonic()
    scored = pool.score([prompt(), prompt()], [sleeper, sleeper])
    assert list(scored.scores) == [1.0, 1.0], scored.reasons
    assert time.monotonic() - start < 3.8


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_no_answer_crosses_between_concurrent_runs(name, pool):
    scored = pool.score([prompt(), prompt()], [fenced(SENDERS[name]), fenced(RECEIVERS[name])])
    assert scored.errors == scored.timeouts == 0, scored.reasons
    assert list(scored.scores) == [0.0, 0.0], scored.reasons
    assert "failed 0/3" in scored.reasons[1], scored.reasons  # the receiver got no token


def test_the_class_tries_every_kernel_object_keyed_by_a_file():
    names = " ".join(PAIRS)
    for word in ("flock", "POSIX record lock", "open file description", "lease"):
        assert word in names
    for word in ("directory notification", "inotify", "futex", "page cache"):
        assert word in names


def test_the_filter_refuses_each_command_the_class_uses():
    """The allow-list's commands (a law: none of these is in it; each refused one has a
    reason in docs/rewards_and_data.md's call-by-call table)."""
    refused_fcntl = {5, 6, 7, 8, 9, 10, 11, 15, 16, 36, 37, 38, 1024, 1025, 1026}
    assert not refused_fcntl & set(commands.FCNTL)
    assert commands.FIOASYNC not in commands.IOCTL
    assert commands.POSIX_FADV_DONTNEED not in commands.FADVISE
    assert {"flock", "mincore"} <= set(commands.REFUSED)
    docs = (HERE.parents[3] / "docs" / "rewards_and_data.md").read_text()
    for call in list(commands.RULES) + list(commands.REFUSED):
        assert f"`{call}`" in docs, call
