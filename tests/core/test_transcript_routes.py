"""An agent episode's segment carries its last reply's routes (routing replay)."""

from __future__ import annotations

import numpy as np

from rlax.core.rollout.agents.transcript import Transcript
from rlax.core.types import Completion


def reply(ids, routes=None):
    ids = np.asarray(ids, np.int32)
    return Completion(ids, np.full(len(ids), -0.5, np.float32), "t", "stop", 0, routes=routes)


def record(n: int, start: int) -> np.ndarray:
    """int16 [n, 1 layer, 2]: distinct ids per token, so a misplaced row shows."""
    return (np.arange(start, start + 2 * n) % 100).reshape(n, 1, 2).astype(np.int16)


def test_a_segment_carries_the_last_replys_record_cut_to_its_ids():
    t = Transcript("e")
    t.request(np.array([1, 2, 3]))
    t.reply(reply([7, 8], record(3 + 2, 0)))  # the request's 3 ids, then the reply's 2
    t.request(np.array([1, 2, 3, 7, 8, 4]))
    last = record(6 + 2, 50)  # the second reply's: all 6 ids before it, then its own 2
    t.reply(reply([6, 9], last))
    t.request(np.array([1, 2, 3, 7, 8, 4, 6, 9, 5]))  # a trailing prompt id: cut
    ((prompt, c),) = t.completions()
    assert len(prompt) + len(c.tokens) == 8
    np.testing.assert_array_equal(c.routes, last)  # the last reply's record, whole
    assert c.routes.dtype == np.int16


def test_prompt_ids_after_the_last_reply_have_no_record_and_none_without_routes():
    t = Transcript("e")
    t.request(np.array([1, 2]))
    t.reply(reply([7], record(3, 0)))
    t.request(np.array([1, 2, 7, 4, 5]))
    t.reply(reply([9]))  # a reply without routes: the earlier record stays the latest
    ((_, c),) = t.completions()
    assert c.routes.shape == (6, 1, 2)
    np.testing.assert_array_equal(c.routes[:3], record(3, 0))
    assert (c.routes[3:] == -1).all()  # 4, 5 and 9: not recorded
    t = Transcript("e")
    t.request(np.array([1, 2]))
    t.reply(reply([7]))
    assert t.completions()[0][1].routes is None
