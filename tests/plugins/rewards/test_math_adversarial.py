"""The math verifier's deadline holds in-process, against inputs made to stall it."""

from __future__ import annotations

import gc
import pathlib
import re
import signal
import sys
import threading
import time

import numpy as np
import pytest

from rlax.core.types import Prompt
from rlax.plugins.rewards.math import deadline as math_deadline
from rlax.plugins.rewards.math import equivalence as math_equivalence
from rlax.plugins.rewards.math.deadline import VerifierTimeout, deadline, run_in_child, within
from rlax.plugins.rewards.math.equivalence import equivalent
from rlax.plugins.rewards.math.verifier import MathReward

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from math_adversarial import ADVERSARIAL, NOTATIONS, slowest_adversarial  # next to this file

TIMEOUT_S = 2.0

# The five inputs that ran with no deadline at all (issue 16).
UNBOUNDED_BEFORE = [
    r"{9}^{{9}^{{9}^{9}}}",
    r"{10}^{{10}^{10}}",
    r"(10^{10})!",
    r"(99999999)!",
    r"10^{999 \cdot 999 \cdot 999}",
]


def prompt(answer: str) -> Prompt:
    return Prompt(id="q", text="q", tokens=np.zeros(1, np.int32), answer=answer)


@pytest.fixture(scope="module")
def reward() -> MathReward:
    reward = MathReward(timeout_s=TIMEOUT_S)
    reward.score(prompt("1"), r"\boxed{\sqrt{2}}")  # math-verify imported before any timing
    return reward


@pytest.mark.parametrize(
    ("name", "completion", "gold"), ADVERSARIAL, ids=[a[0] for a in ADVERSARIAL]
)
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_every_adversarial_input_is_wrong_within_its_timeout(reward, name, completion, gold):
    # The garbage of earlier tests first: a full collection inside the timed call (2.9 s
    # once in CI, under load, its alarm raised in a weakref callback, where Python ignores
    # it) is time no deadline can cut, and none of this input's doing.
    gc.collect()
    start = time.perf_counter()
    result = reward.score(prompt(gold), completion)
    elapsed = time.perf_counter() - start
    assert result.score == 0.0, result.reason
    assert elapsed < TIMEOUT_S, f"{name}: {elapsed:.2f}s ({result.reason})"


@pytest.mark.parametrize(("name", "completion", "gold"), NOTATIONS, ids=[n[0] for n in NOTATIONS])
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_the_notation_rules_are_linear_in_the_text(reward, name, completion, gold):
    gc.collect()
    start = time.perf_counter()
    result = reward.score(prompt(gold), completion)
    elapsed = time.perf_counter() - start
    assert result.score == 0.0, result.reason
    assert not result.reason.startswith("timeout"), f"{name}: {result.reason}"
    assert elapsed < TIMEOUT_S / 2, f"{name}: {elapsed:.2f}s ({result.reason})"


def test_there_are_enough_and_some_are_100k_characters():
    assert len(ADVERSARIAL) >= 30
    assert sum(len(completion) >= 100_000 for _, completion, _ in ADVERSARIAL) >= 10


@pytest.mark.parametrize("answer", UNBOUNDED_BEFORE)
@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_the_deadline_alone_stops_what_the_prefilter_refuses(monkeypatch, answer):
    # With the pre-filter off, math-verify itself runs on them: its `except
    # Exception` blocks must not swallow the timeout.
    monkeypatch.setattr(math_equivalence, "_TOWER", re.compile(r"(?!)"))
    reward = MathReward(timeout_s=1.0)
    start = time.perf_counter()
    result = reward.score(prompt("5"), rf"\boxed{{{answer}}}")
    assert time.perf_counter() - start < 1.0
    assert result.score == 0.0 and result.reason.startswith(("timeout", "wrong")), result.reason


def test_the_timeout_is_no_exception_and_passes_except_exception():
    assert not issubclass(VerifierTimeout, Exception)
    swallowed = False
    with pytest.raises(VerifierTimeout), deadline(0.1):
        try:
            time.sleep(5)
        except Exception:  # noqa: BLE001 - what math-verify does around its work
            swallowed = True
    assert not swallowed


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_an_inner_deadline_ends_first_and_the_outer_still_fires():
    handler = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()

    def inner_then_sleep() -> None:
        assert within(0.1, time.sleep, 5) == (False, "took longer than 0.1s")
        assert time.perf_counter() - start < 0.4
        time.sleep(5)

    assert within(0.5, inner_then_sleep) == (False, "took longer than 0.5s")
    assert 0.45 < time.perf_counter() - start < 1.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler  # restored


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_an_outer_deadline_shorter_than_the_inner_one_wins():
    # The inner call does not catch the outer's timeout: it reaches its owner.
    start = time.perf_counter()
    assert within(0.2, within, 5.0, time.sleep, 5) == (False, "took longer than 0.2s")
    assert time.perf_counter() - start < 1.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_foreign_timer_fires_on_time_through_its_own_handler():
    fired: list[float] = []
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, lambda s, f: fired.append(time.perf_counter()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        assert within(0.1, time.sleep, 1.0) == (False, "took longer than 0.1s")
        assert fired == []
        time.sleep(0.5)  # re-armed on exit: fires at 0.3 s
        assert len(fired) == 1 and 0.25 < fired[0] - start < 0.5
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # shorter than ours this time
        assert within(5.0, time.sleep, 0.5) == (True, None)
        assert len(fired) == 2 and 0.15 < fired[1] - start - 0.6 < 0.4
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_a_child_process_is_killed_at_its_deadline():
    start = time.perf_counter()
    with pytest.raises(VerifierTimeout, match="child process killed"):
        run_in_child(time.sleep, (30,), 1.0)
    assert time.perf_counter() - start < 2.0
    with pytest.raises(RuntimeError, match="ValueError"):
        run_in_child(int, ("not a number",), 30.0)
    assert run_in_child(abs, (-3,), 30.0) == 3


def test_off_the_main_thread_the_symbolic_stage_runs_in_a_child():
    results: dict[str, object] = {}

    def score() -> None:
        results["verdict"] = equivalent(r"2\sqrt{2}", r"\sqrt{8}", timeout_s=30.0)
        results["wrong"] = equivalent(r"\sqrt{3}", r"\sqrt{8}", timeout_s=30.0)
        results["reward"] = MathReward(timeout_s=30.0).score(prompt("0.5"), r"\boxed{\frac12}")

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(120)
    assert results["verdict"] == math_equivalence.Verdict(True, "symbolic (child)")
    assert results["wrong"] == math_equivalence.Verdict(False, "symbolic (child)")
    assert results["reward"].score == 1.0  # numbers need no child


def test_slowest_adversarial_names_an_input_and_its_time():
    name, seconds = slowest_adversarial(timeout_s=1.0)
    assert name in {a[0] for a in [*ADVERSARIAL, *NOTATIONS]}
    assert 0.0 < seconds < 1.0


def test_a_swallowed_timeout_is_raised_again_until_the_block_exits():
    # CI lost one inside a WeakSet callback (Python ignores exceptions raised
    # there): the verifier ran on past its deadline with no timer left.
    swallowed: list[str] = []

    def stubborn() -> str:
        end = time.monotonic() + 10.0
        try:
            while time.monotonic() < end:
                pass
        except BaseException as exc:  # noqa: BLE001 - a library's bare except
            swallowed.append(type(exc).__name__)
        while time.monotonic() < end:
            pass
        return "ran to the end"

    assert within(0.2, stubborn) == (False, "took longer than 0.2s")
    assert swallowed == ["VerifierTimeout"]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the retry disarmed on exit


def test_an_alarm_during_the_deadlines_own_exit_waits_for_the_block():
    # Raised from the deadline's `finally` before it disarms, a timeout would
    # leave the stack stale and the timer armed: it re-arms and returns.
    handler = signal.getsignal(signal.SIGALRM)
    manager = deadline(0.05)
    manager.__enter__()
    signal.setitimer(signal.ITIMER_REAL, 0)  # no real alarm: we call the handler
    time.sleep(0.1)
    expire = signal.getsignal(signal.SIGALRM)
    assert callable(expire)
    expire(signal.SIGALRM, manager.gen.gi_frame)  # returns: no timeout raised
    assert 0.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= math_deadline.RETRY_S
    with pytest.raises(VerifierTimeout):
        expire(signal.SIGALRM, sys._getframe())  # user code: raised
    manager.__exit__(None, None, None)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler
