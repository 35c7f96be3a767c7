"""The arithmetic task: correct answers, a held-out split disjoint from training."""

import itertools

import numpy as np
import pytest

from rlax.core.models.tokenizer import CharTokenizer
from rlax.plugins.tasks.arithmetic import ALPHABET, ArithmeticTask, is_held_out

TOK = CharTokenizer(ALPHABET)


def take(task, split, seed, n):
    return list(itertools.islice(task.prompts(split, tokenizer=TOK, seed=seed), n))


def test_prompt_text_tokens_and_answer():
    task = ArithmeticTask(digits=3, operations="+-*", num_eval=50)
    for p in take(task, "train", 0, 200):
        left, right = p.text[:-1], p.text[-1]
        assert right == "="
        assert str(eval(left)) == p.answer  # the expression is plain Python arithmetic
        np.testing.assert_array_equal(p.tokens, TOK.encode(p.text, bos=True))
        assert p.tokens[0] == TOK.bos_id


def test_train_never_yields_held_out_problems_and_eval_only_held_out():
    task = ArithmeticTask(digits=2, eval_fraction=0.1, num_eval=200)
    train_ids = {p.id for p in take(task, "train", 3, 5000)}
    eval_ids = {p.id for p in take(task, "eval", 3, 10_000)}
    assert len(eval_ids) == 200  # distinct, and exactly num_eval of them
    assert not train_ids & eval_ids
    assert all(is_held_out(i, 0.1) for i in eval_ids)
    assert not any(is_held_out(i, 0.1) for i in train_ids)


def test_held_out_share_is_close_to_eval_fraction():
    problems = [f"{a}+{b}" for a in range(100) for b in range(100)]
    share = np.mean([is_held_out(p, 0.1) for p in problems])
    assert 0.08 < share < 0.12


def test_eval_set_does_not_depend_on_the_seed_but_train_order_does():
    task = ArithmeticTask(digits=2, num_eval=50)
    assert [p.id for p in take(task, "eval", 0, 50)] == [p.id for p in take(task, "eval", 99, 50)]
    assert [p.id for p in take(task, "train", 0, 20)] != [p.id for p in take(task, "train", 1, 20)]
    assert [p.id for p in take(task, "train", 5, 20)] == [p.id for p in take(task, "train", 5, 20)]


def test_template_changes_the_text_only():
    plain = take(ArithmeticTask(digits=2, num_eval=50), "train", 4, 30)
    task = ArithmeticTask(digits=2, num_eval=50, template="What is {problem}?")
    words = CharTokenizer(ALPHABET + "Whatis ?")
    asked = list(itertools.islice(task.prompts("train", tokenizer=words, seed=4), 30))
    assert [p.id for p in asked] == [p.id for p in plain]
    assert [p.answer for p in asked] == [p.answer for p in plain]
    for p in asked:
        assert p.text == f"What is {p.id}?"
        np.testing.assert_array_equal(p.tokens, words.encode(p.text, bos=True))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"digits": 0}, "digits"),
        ({"operations": "/"}, "operations"),
        ({"eval_fraction": 1.5}, "eval_fraction"),
        ({"digits": 1, "num_eval": 500}, "num_eval"),
        ({"template": "What is {x}?"}, "template"),
        ({"template": "What is it?"}, "template"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="split"):
        next(ArithmeticTask().prompts("test", tokenizer=TOK, seed=0))
