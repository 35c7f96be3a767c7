"""A worker's reward pool boots in the background (issue 38, item 3: a restarted worker no
longer waits for its verifier processes before it pulls its weights)."""

from __future__ import annotations

import textwrap
import threading

import numpy as np
import pytest

from rlax.core.rollout.reward_pool import RewardPool
from rlax.core.types import Prompt
from rlax.core.worker.background_pool import BackgroundPool

GATED = """
    import os, pathlib, time

    class Gated:
        '''Loads (in the pool's process) only once the file GATE exists; scores len(text).'''

        def __init__(self, gate):
            self.gate = gate

        def __setstate__(self, state):
            self.__dict__.update(state)
            while not pathlib.Path(self.gate).exists():
                time.sleep(0.01)

        def score(self, prompt, text):
            return float(len(text))
"""


@pytest.fixture
def gated(tmp_path, monkeypatch):
    (tmp_path / "pool_gated.py").write_text(textwrap.dedent(GATED))
    monkeypatch.syspath_prepend(str(tmp_path))
    import pool_gated

    return pool_gated.Gated(str(tmp_path / "gate")), tmp_path / "gate"


def prompt() -> Prompt:
    return Prompt(id="p", text="p", tokens=np.zeros(1, np.int32), answer=None)


def test_the_pool_starts_while_the_worker_goes_on_and_scores_once_ready(gated):
    reward, gate = gated
    pool = BackgroundPool(reward, workers=1, timeout_s=5.0)
    # Returned although its process cannot be ready (it waits for the gate): a RewardPool
    # would still be waiting here.
    assert isinstance(pool, RewardPool) and pool._boot.is_alive()
    scored: list = []
    scorer = threading.Thread(target=lambda: scored.append(pool.score([prompt()] * 2, ["ab", "c"])))
    scorer.start()
    scorer.join(0.5)
    assert scored == []  # the first score waits for the pool
    gate.write_text("")
    scorer.join(60)
    assert scored[0].scores.tolist() == [2.0, 1.0] and pool.workers == 1
    pool.close()
    assert not pool._boot.is_alive()


def test_a_pool_that_cannot_start_fails_at_its_first_score_and_closes_quietly():
    class Local:  # defined in a function: the pool's process cannot import it
        def score(self, prompt, text):
            return 1.0

    pool = BackgroundPool(Local(), workers=1)
    with pytest.raises(RuntimeError, match="pickle"):
        pool.score([prompt()], ["x"])
    pool.close()  # nothing started, nothing to stop
