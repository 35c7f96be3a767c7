"""Groups -> TrainBatch layout, checked cell by cell."""

import numpy as np
import pytest

from rlax.core.trainer.batches import make_batch
from rlax.core.types import Completion, Group, Prompt


def comp(tokens, logprobs):
    return Completion(np.array(tokens, np.int32), np.array(logprobs, np.float32), "", "stop", 0)


def test_layout_by_hand():
    p = Prompt("a", "", np.array([1, 5, 6], np.int32), "")
    g = Group(p, (comp([7, 2], [-0.1, -0.2]), comp([0, 8, 2], [-0.3, -0.4, -0.5])), np.zeros(2))
    b = make_batch([g], np.array([[1.5, -1.5]]), length_bucket=4, row_multiple=3)
    # P = 4 (3 rounded up), C = 4 (3 rounded up), T = 8; 2 rows padded to 3.
    np.testing.assert_array_equal(b.tokens[0], [0, 1, 5, 6, 7, 2, 0, 0])
    np.testing.assert_array_equal(b.tokens[1], [0, 1, 5, 6, 0, 8, 2, 0])
    np.testing.assert_array_equal(b.attention_mask[0], [0, 1, 1, 1, 1, 1, 0, 0])
    # A generated token equal to the pad id (0) still counts: masks come from lengths.
    np.testing.assert_array_equal(b.attention_mask[1], [0, 1, 1, 1, 1, 1, 1, 0])
    # Position t predicts token t+1: targets are the generated tokens.
    np.testing.assert_array_equal(b.loss_mask[0], [0, 0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(b.loss_mask[1], [0, 0, 0, 1, 1, 1, 0])
    np.testing.assert_allclose(b.old_logprobs[1], [0, 0, 0, -0.3, -0.4, -0.5, 0])
    np.testing.assert_allclose(b.advantages[0], [0, 0, 0, 1.5, 1.5, 0, 0])
    np.testing.assert_allclose(b.advantages[1], [0, 0, 0, -1.5, -1.5, -1.5, 0])
    # The filler row is fully masked.
    assert not b.attention_mask[2].any() and not b.loss_mask[2].any()
    np.testing.assert_array_equal(b.group_ids, [0, 0, -1])


def test_fixed_completion_len_keeps_shapes_data_independent():
    p = Prompt("a", "", np.array([1, 5], np.int32), "")
    short = Group(p, (comp([2], [-0.1]),), np.zeros(1))
    long = Group(p, (comp([3, 4, 5, 2], [-0.1] * 4),), np.zeros(1))
    a = make_batch([short], np.zeros((1, 1)), completion_len=6)
    b = make_batch([long], np.zeros((1, 1)), completion_len=6)
    assert a.tokens.shape == b.tokens.shape == (1, 8 + 6)  # P bucketed to 8, C exactly 6
    with pytest.raises(ValueError, match="completion_len"):
        make_batch([long], np.zeros((1, 1)), completion_len=3)


def test_errors_name_the_problem():
    p = Prompt("a", "", np.array([1], np.int32), "")
    g = Group(p, (comp([2], [-0.1]),), np.zeros(1))
    with pytest.raises(ValueError, match="no groups"):
        make_batch([], np.zeros((0, 1)))
    with pytest.raises(ValueError, match="row_multiple"):
        make_batch([g], np.zeros((1, 1)), row_multiple=0)
