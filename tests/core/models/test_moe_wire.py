"""Routing replay's record on the parameter server's wire: it round-trips, and a malformed
one is refused before it reaches the queue."""

from __future__ import annotations

import numpy as np
import pytest

from rlax.core.param_server.codec import (
    WireError,
    check_group,
    group_to_msg,
    msg_to_group,
)
from rlax.core.types import Completion, Group, Prompt

PROMPT = Prompt("p", "", np.array([3, 4, 5], np.int32), None)


def group(routes: np.ndarray | None) -> Group:
    c = Completion(np.array([7, 8], np.int32), np.array([-0.5, -1.0], np.float32), "", "stop", 2)
    c = Completion(**{**c.__dict__, "routes": routes})
    return Group(PROMPT, [c], [1.0])


def checked(g: Group):
    msg = group_to_msg(g, "lease")
    check_group(msg, max_completions=4, max_tokens=8, newest_version=2)
    return msg


def test_routes_round_trip_exactly():
    routes = np.random.default_rng(0).integers(-1, 128, (5, 3, 2)).astype(np.int16)
    back = msg_to_group(checked(group(routes))).completions[0]
    assert back.routes.dtype == np.int16 and back.routes.shape == (5, 3, 2)
    np.testing.assert_array_equal(back.routes, routes)
    assert msg_to_group(checked(group(None))).completions[0].routes is None
    # 2 bytes per id: 3 sparse layers x top-2 = 12 bytes per token.
    assert len(group_to_msg(group(routes), "lease").completions[0].routes) == 5 * 12


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        (np.zeros((4, 3, 2), np.int16), "routes for 4 tokens, the row has 5"),
        (np.zeros((6, 3, 2), np.int16), "routes for 6 tokens, the row has 5"),
        (np.full((5, 3, 2), -2, np.int16), "an expert id below -1"),
        (np.zeros((5, 0, 2), np.int16), "routes of 0 bytes with shape"),
    ],
)
def test_malformed_routes_are_refused(routes, message):
    with pytest.raises(WireError, match=message):
        checked(group(routes))
