"""RewardPool: hangs, crashes and exceptions are counted zeros; the pool keeps serving."""

from __future__ import annotations

import pathlib
import textwrap
import time

import numpy as np
import pytest

from rlax.core.rollout.reward_pool import RewardPool
from rlax.core.types import Prompt

DOUBLES = """
    import os, time
    from rlax.core.types import RewardResult

    class Doubles:
        '''Behaves as the completion text says: a number, "hang", "crash", "raise",
        "deadline", "nan".'''

        def score(self, prompt, text):
            if text == "hang":
                time.sleep(3600)
            if text == "spin":
                while True:
                    pass
            if text == "crash":
                os._exit(3)
            if text == "raise":
                raise KeyError("boom")
            if text == "deadline":  # the reward's own deadline ran out (rewards.judge's)
                raise TimeoutError("no judgement in 2s")
            if text == "nan":
                return float("nan")
            if text == "child":
                import subprocess
                child = subprocess.Popen(["sleep", "3600"])
                with open(prompt.text, "w") as f:
                    f.write(str(child.pid))
                time.sleep(3600)
            if text == "pid":
                return RewardResult(float(os.getpid()), "pid")
            return RewardResult(float(text), f"value {text}")
"""


@pytest.fixture
def doubles(tmp_path, monkeypatch):
    (tmp_path / "pool_doubles.py").write_text(textwrap.dedent(DOUBLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    import pool_doubles

    return pool_doubles.Doubles()


def prompt(text: str = "p") -> Prompt:
    return Prompt(id="p", text=text, tokens=np.zeros(1, np.int32), answer=None)


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_failures_are_counted_zeros_with_reasons_and_the_rest_is_scored(doubles):
    texts = ["1", "hang", "2", "crash", "raise", "nan", "spin", "3"]
    with RewardPool(doubles, workers=2, timeout_s=1.0) as pool:
        start = time.monotonic()
        result = pool.score([prompt()] * len(texts), texts)
        elapsed = time.monotonic() - start

    np.testing.assert_array_equal(result.scores, [1, 0, 2, 0, 0, 0, 0, 3])
    np.testing.assert_array_equal(result.failed, [0, 1, 0, 1, 1, 1, 1, 0])
    assert (result.errors, result.timeouts) == (3, 2)
    assert result.reasons[0] == "value 1"
    assert "timed out after 1s" in result.reasons[1]
    assert "worker crashed (exit code 3)" in result.reasons[3]
    assert "KeyError" in result.reasons[4]
    assert "non-finite" in result.reasons[5]
    # Two 1 s timeouts on two workers run side by side, not one after the other.
    assert elapsed < 8


def test_the_pool_keeps_serving_after_killing_workers(doubles):
    with RewardPool(doubles, workers=1, timeout_s=0.5) as pool:
        first = pool.score([prompt()] * 2, ["hang", "pid"])
        second = pool.score([prompt()] * 2, ["crash", "pid"])
        third = pool.score([prompt()], ["5"])
        assert pool.restarts == 2
    assert first.timeouts == 1 and second.errors == 1
    assert first.scores[1] != second.scores[1]  # a fresh process replaced the killed one
    assert third.scores.tolist() == [5.0] and not third.failed.any()


@pytest.mark.serial  # a wall-clock bound (tests/test_suite_rules.py)
def test_calls_queued_behind_a_hung_one_are_handed_out_again(doubles):
    texts = ["1", "hang", "2", "3", "4"]
    with RewardPool(doubles, workers=1, timeout_s=1.0, prefetch=4) as pool:
        start = time.monotonic()
        result = pool.score([prompt()] * len(texts), texts)
        elapsed = time.monotonic() - start
    assert result.scores.tolist() == [1, 0, 2, 3, 4]
    assert (result.errors, result.timeouts) == (0, 1)
    assert elapsed < 4  # one timeout, not one per queued call


def test_each_call_gets_its_own_timeout_counted_from_when_it_starts(doubles, tmp_path):
    # Four calls of 0.4 s queued at one worker: 1.6 s in all, none over its 0.6 s budget.
    (tmp_path / "slow.py").write_text(
        "import time\nclass Slow:\n    def score(self, prompt, text):\n"
        "        time.sleep(0.4)\n        return 1.0\n"
    )
    import slow

    with RewardPool(slow.Slow(), workers=1, timeout_s=0.6, prefetch=4) as pool:
        result = pool.score([prompt()] * 4, ["x"] * 4)
    assert result.scores.tolist() == [1, 1, 1, 1] and result.timeouts == 0


def test_a_timeout_kills_everything_the_call_started(doubles, tmp_path):
    marker = tmp_path / "pgid"
    with RewardPool(doubles, workers=1, timeout_s=1.5) as pool:
        result = pool.score([prompt(str(marker))], ["child"])
    assert result.timeouts == 1
    assert gone(int(marker.read_text()))  # the reward's own child did not survive


def gone(pid: int, wait_s: float = 3.0) -> bool:
    """True once ``pid`` has exited (a zombie waiting for init to reap it counts)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in "ZX":
            return True
        time.sleep(0.05)
    return False


def test_in_process_mode_contains_exceptions(doubles):
    pool = RewardPool(doubles, workers=0)
    result = pool.score([prompt()] * 3, ["1", "raise", "nan"])
    assert result.scores.tolist() == [1.0, 0.0, 0.0]
    assert (result.errors, result.timeouts) == (2, 0)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_s_own_timeout_is_counted_as_a_timeout_not_an_error(doubles, workers):
    """A reward that raises TimeoutError ran out of its own time (the judge's deadline):
    a timeout, like a call the pool killed at its deadline, in a worker or in-process."""
    with RewardPool(doubles, workers=workers, timeout_s=30.0) as pool:
        result = pool.score([prompt()] * 3, ["1", "deadline", "raise"])
    assert result.scores.tolist() == [1.0, 0.0, 0.0]
    assert result.failed.tolist() == [False, True, True]
    assert (result.errors, result.timeouts) == (1, 1)
    assert result.reasons[1] == "timed out: TimeoutError: no judgement in 2s"


def test_an_unloadable_reward_is_an_error_at_start():
    class Local:  # defined in a function: a worker cannot import it
        def score(self, prompt, text):
            return 1.0

    with pytest.raises(RuntimeError, match="pickle"):
        RewardPool(Local(), workers=1)


def test_bad_arguments(doubles):
    with pytest.raises(ValueError, match="timeout_s"):
        RewardPool(doubles, workers=1, timeout_s=0)
    pool = RewardPool(doubles, workers=0)
    with pytest.raises(ValueError, match="2 prompts but 1 texts"):
        pool.score([prompt(), prompt()], ["1"])
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.score([], [])


def test_a_worker_that_dies_while_its_next_call_is_sent_is_counted_once(doubles):
    # The race CI met: the worker crashes on its head call while the parent sends it the
    # next one (prefetch). The crash is that call's error; it is never handed out again.
    with RewardPool(doubles, workers=1, timeout_s=30.0, prefetch=2) as pool:
        worker = pool._workers[0]
        real, sent = worker.conn, []

        class DiesOnSecondSend:
            def __getattr__(self, name):
                return getattr(real, name)

            def send(self, message):
                sent.append(message)
                if len(sent) == 2:
                    worker.process.join(10)  # it has died on "crash"
                    raise BrokenPipeError
                real.send(message)

        worker.conn = DiesOnSecondSend()
        result = pool.score([prompt()] * 2, ["crash", "7"])
        assert pool.restarts == 1
    assert result.scores.tolist() == [0.0, 7.0]
    assert result.failed.tolist() == [1, 0] and result.errors == 1
    assert "worker crashed (exit code 3)" in result.reasons[0]
