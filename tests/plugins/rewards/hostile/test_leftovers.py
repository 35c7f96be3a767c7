"""Tests in a run share no process: a case's leftovers never answer a later case.

Every program of ``leftovers.py`` answers the first case itself and the
second only through a process the first case left behind; the control
program answers both itself. So the control's 1 says the plan and the
program's own output are fine, and each hostile program's 1/2 says the
leftover reached nothing (it would be 2/2 otherwise). In the run's world and
in the weak mode (the harness's own sweep by process group and children) as
root. As an ordinary user the weak mode runs the program as the caller's own
uid, whose process limit (``RLIMIT_NPROC``, per uid) the caller's own
processes already use (pytest's workers, other runs): the harness's fork of a
stdin/stdout case fails there whatever the program does, so that mode is
proven as root only.
"""

from __future__ import annotations

import os
import pathlib
import runpy
import warnings

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.code.verifier import CodeReward
from rlax.plugins.rewards.sandbox.run import WeakIsolationWarning

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs Linux")

HERE = pathlib.Path(__file__).parent
CASES = runpy.run_path(str(HERE / "cases.py"))
LEFT = runpy.run_path(str(HERE / "leftovers.py"))
LEFTOVERS, HEAD = LEFT["LEFTOVERS"], LEFT["HEAD"]
# the leftovers get time to act: a run's wall time well past the later case's wait
LIMITS = {**CASES["LIMITS"], "wall_s": 4.0}
SUM_STDIN = CASES["TESTS"]["sum_stdin"]
MODES = [pytest.param(True, id="world")]
MODES += [pytest.param(False, id="weak")] if os.geteuid() == 0 else []
CONTROL = HEAD + "if not first:\n    print(answer(data))\n"


def score(source: str, namespaces: bool):
    reward = CodeReward(**LIMITS, namespaces=namespaces)
    prompt = Prompt(id="sum_stdin", text="", tokens=np.zeros(1, np.int32), answer=SUM_STDIN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if not namespaces else "error", WeakIsolationWarning)
        result = reward.run(prompt, f"```python\n{source}```")
    return reward.judge(result), result


@pytest.mark.parametrize("namespaces", MODES)
def test_the_control_answers_both_cases_itself(namespaces):
    judged, result = score(CONTROL, namespaces)
    assert judged.score == 1.0 and result.passed == result.total == 2, result.stderr[-300:]


@pytest.mark.parametrize("namespaces", MODES)
@pytest.mark.parametrize("name", sorted(LEFTOVERS))
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_a_leftover_never_answers_a_later_case(name, namespaces):
    judged, result = score(LEFTOVERS[name], namespaces)
    assert judged.score == 0.0, (judged.reason, result.stderr[-300:])
    # the first case was the program's own and right; the second got no leftover's answer
    assert (result.passed, result.total) == (1, 2), (judged.reason, result.stderr[-300:])
    assert result.verdict_by == "supervisor"


def test_the_class_has_several_variants():
    assert len(LEFTOVERS) >= 5
    assert len({source for source in LEFTOVERS.values()}) == len(LEFTOVERS)
