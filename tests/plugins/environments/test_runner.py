"""Episodes token in, token out: the ids the trainer gets are the ids the sampler made."""

from __future__ import annotations

import logging
import pathlib
import sys

import numpy as np
import pytest
from flax import nnx

from rlax.core.episodes import Observation
from rlax.core.evaluation import traces
from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.param_server import codec
from rlax.core.rollout.groups import episode_metrics, score_groups
from rlax.core.trainer.batches import make_batch
from rlax.core.types import Group
from rlax.plugins.environments.guess import ALPHABET, GuessEnvironment, GuessReward, GuessTask
from rlax.plugins.environments.runner import EpisodeSampler
from rlax.plugins.samplers.jax_sampler import JaxSampler

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from scripted import ScriptedSampler, Spy

TOK = CharTokenizer(ALPHABET)
CFG = TransformerConfig(
    vocab_size=TOK.vocab_size,
    num_layers=2,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
)


def secret_prompt(secret):
    return next(
        p for p in GuessTask(size=10).prompts("eval", tokenizer=TOK, seed=0) if p.answer == secret
    )


def play(script, secret=5, **limits):
    sampler = EpisodeSampler(
        sampler=ScriptedSampler(script), environment=GuessEnvironment(**limits)
    )
    sampler.setup(None, TOK)
    ((episode,),) = sampler.generate([secret_prompt(secret)], 1, seed=0)
    return episode, sampler.sampler


def segments(ids):
    return np.concatenate(
        [TOK.encode(s) if s in "<>" else np.append(TOK.encode(s), TOK.eos_id) for s in ids]
    ).tolist()


def test_a_won_game_by_hand():
    c, inner = play(["3", "7", "5"])
    # 3 EOS > 7 EOS < 5 EOS: model tokens 1, the two hints 0, one sequence.
    assert c.tokens.tolist() == segments(["3", ">", "7", "<", "5"])
    assert c.loss_mask.tolist() == [1, 1, 0, 1, 1, 0, 1, 1]
    np.testing.assert_array_equal(c.logprobs, np.where(c.loss_mask == 1, -0.25, 0.0))
    assert c.finish_reason == "stop" and c.policy_version == 3
    assert c.episode["reward"] == 1.0 and c.episode["turns"] == 3
    assert c.episode["observation_tokens"] == 2 and c.episode["reason"] == "found in 3"
    # Each turn continued the ids as they stood: prompt + everything before, appended.
    prompt = secret_prompt(5).tokens.tolist()
    assert [call[0].tolist() for call in inner.calls] == [
        prompt,
        prompt + segments(["3", ">"]),
        prompt + segments(["3", ">", "7", "<"]),
    ]


def test_the_limits_end_an_episode():
    c, _ = play(["3", "7", "5"], max_turns=2)
    assert c.tokens.tolist() == segments(["3", ">", "7"])  # the last hint is not appended
    assert c.finish_reason == "length" and c.episode["reward"] == 0.0
    c, _ = play(["123"], max_turn_tokens=2)
    assert c.tokens.tolist() == TOK.encode("12").tolist() and c.finish_reason == "length"
    c, _ = play(["3", "7", "5"], max_episode_tokens=4)  # 3 EOS > 7 | EOS cut
    assert c.tokens.tolist() == segments(["3", ">"]) + TOK.encode("7").tolist()
    assert c.loss_mask.tolist() == [1, 1, 0, 1] and c.episode["reward"] == 0.0


class Broken(GuessEnvironment):
    """An environment whose every step raises."""

    def start(self, prompt, tokenizer):
        episode = super().start(prompt, tokenizer)
        episode.step = lambda text: 1 / 0
        return episode


def test_an_environment_that_raises_costs_its_episode_not_the_worker(caplog):
    sampler = EpisodeSampler(sampler=ScriptedSampler(["5"]), environment=Broken())
    sampler.setup(None, TOK)
    with caplog.at_level(logging.WARNING, "rlax.environments"):
        ((c,),) = sampler.generate([secret_prompt(5)], 1, seed=0)
    assert c.episode["reward"] == 0.0 and c.episode["failed"] == 1.0
    assert "ZeroDivisionError" in c.episode["reason"] and "ZeroDivisionError" in caplog.text


class Opening(GuessEnvironment):
    """An environment whose episodes open with ids of their own: ``openings`` in turn."""

    def __init__(self, openings, **kw):
        super().__init__(**kw)
        self.openings = list(openings)

    def start(self, prompt, tokenizer):
        episode = super().start(prompt, tokenizer)
        episode.prompt_tokens = self.openings.pop(0)
        return episode


def test_an_episode_that_opens_with_its_own_ids_makes_them_its_group_s_prompt():
    opening = TOK.encode("??").tolist()
    sampler = EpisodeSampler(sampler=ScriptedSampler(["5"]), environment=Opening([opening] * 2))
    sampler.setup(None, TOK)
    prompt = secret_prompt(5)
    (group,) = sampler.generate([prompt], 2, seed=0)
    # The first turn continued the opening, not the task's prompt; the trainer gets it back.
    assert sampler.sampler.calls[0][0].tolist() == opening
    assert [c.episode["prompt_tokens"] for c in group] == [opening, opening]
    assert [c.episode["reward"] for c in group] == [1.0, 1.0]
    (scored,) = score_groups([prompt], [group], None, 2)
    assert scored.prompt.tokens.tolist() == opening and prompt.tokens.tolist() != opening
    # Without an opening nothing is added: the prompt stays the task's.
    c, _ = play(["5"])
    assert "prompt_tokens" not in c.episode


@pytest.mark.parametrize(
    "second, why",
    [
        ("differs", "prompt_tokens differ from its group's"),
        ([], "prompt_tokens must be a non-empty list of token ids"),
        ([[1, 2]], "prompt_tokens must be a non-empty list of token ids"),
        (["a"], "prompt_tokens must be a non-empty list of token ids"),
        ([1.5], "prompt_tokens must be a non-empty list of token ids"),
        ([-1], "outside the vocabulary"),
        ([TOK.vocab_size], "outside the vocabulary"),
    ],
)
def test_an_opening_that_is_not_its_group_s_or_not_ids_costs_its_episode(second, why):
    first = TOK.encode("??").tolist()
    second = TOK.encode("?").tolist() if second == "differs" else second
    script = ["5"]
    sampler = EpisodeSampler(sampler=ScriptedSampler(script), environment=Opening([first, second]))
    sampler.setup(None, TOK)
    (group,) = sampler.generate([secret_prompt(5)], 2, seed=0)
    ok, lost = group
    assert ok.episode["reward"] == 1.0 and ok.episode["prompt_tokens"] == first
    assert lost.episode["reward"] == 0.0 and lost.episode["failed"] == 1.0
    assert why in lost.episode["reason"]
    assert lost.tokens.tolist() == [TOK.eos_id] and lost.loss_mask.tolist() == [0]
    (scored,) = score_groups([secret_prompt(5)], [group], None, 2)
    assert scored.prompt.tokens.tolist() == first  # the group keeps one prompt


class OffVocabulary(GuessEnvironment):
    """Answers a wrong guess with an id the model does not have."""

    def start(self, prompt, tokenizer):
        episode = super().start(prompt, tokenizer)
        step = episode.step

        def off(text):
            seen = step(text)
            return None if seen is None else Observation(np.array([TOK.vocab_size]), "?")

        episode.step = off
        return episode


def test_an_observation_outside_the_vocabulary_costs_its_episode_not_the_batch():
    sampler = EpisodeSampler(sampler=ScriptedSampler(["3", "5"]), environment=OffVocabulary())
    sampler.setup(None, TOK)
    (won,), (lost,) = sampler.generate([secret_prompt(3), secret_prompt(5)], 1, seed=0)
    assert won.episode["reward"] == 1.0 and won.episode["failed"] == 0.0
    assert lost.episode["reward"] == 0.0 and lost.episode["failed"] == 1.0
    assert "outside the vocabulary" in lost.episode["reason"]
    assert lost.tokens.tolist() == segments(["3"])  # nothing of the observation appended


def test_the_episode_reward_replaces_the_reward_plugin_and_metrics_count_episodes():
    won, _ = play(["3", "7", "5"])
    lost, _ = play(["3", "7"], max_turns=2)
    prompt = secret_prompt(5)

    class Never:
        def score(self, prompt, text):
            raise AssertionError("the reward plugin is not called for episodes")

    (group,) = score_groups([prompt], [(won, lost)], Never(), 2)
    assert group.rewards.tolist() == [1.0, 0.0]
    assert GuessReward().score(prompt, won.text) == 1.0  # the text says the same
    assert GuessReward().score(prompt, lost.text) == 0.0
    assert episode_metrics([group]) == {
        "turns_mean": 2.5,
        "tool_calls_mean": 0.0,
        "tool_errors_mean": 0.0,
        "observation_tokens_mean": 1.5,
        "failed_mean": 0.0,
    }


def test_a_trace_of_an_episode_gives_the_environment_s_reason_not_the_reward_plugin_s():
    sampler = EpisodeSampler(sampler=ScriptedSampler(["5"]), environment=Broken())
    sampler.setup(None, TOK)
    ((failed,),) = sampler.generate([secret_prompt(5)], 1, seed=0)
    won, _ = play(["3", "7", "5"])

    class Never:
        def score(self, prompt, text):
            raise AssertionError("an episode is scored by its environment alone")

    (group,) = score_groups([secret_prompt(5)], [(failed, won)], Never(), 2)
    (row,) = traces.trace_rows(3, [group], Never())
    assert [c["reward"] for c in row["completions"]] == [0.0, 1.0]
    assert [c["reason"] for c in row["completions"]] == [
        failed.episode["reason"],
        won.episode["reason"],
    ]
    assert "ZeroDivisionError" in row["completions"][0]["reason"]


def test_an_episode_crosses_the_wire_unchanged_and_a_bad_mask_is_refused():
    c, _ = play(["3", "7", "5"])
    msg = codec.completion_to_msg(c)
    codec.check_completion(msg, "c", max_tokens=64, newest_version=3)
    back = codec.msg_to_completion(msg)
    assert back.loss_mask.tolist() == c.loss_mask.tolist() and back.episode == c.episode
    msg.loss_mask = bytes([1, 0])
    with pytest.raises(codec.WireError, match="loss mask"):
        codec.check_completion(msg, "c", max_tokens=64, newest_version=3)


def test_the_batch_has_holes_where_the_observations_are():
    c, _ = play(["3", "7", "5"])
    prompt = secret_prompt(5)
    batch = make_batch(
        [Group(prompt, (c,), np.ones(1, np.float32))],
        np.full((1, 1), 2.0),
        length_bucket=4,
        completion_len=12,
    )
    p = 4  # the 2-id prompt left-padded to the bucket
    np.testing.assert_array_equal(batch.tokens[0, p - 2 : p + 8], np.r_[prompt.tokens, c.tokens])
    assert batch.loss_mask[0, p - 1 : p + 7].tolist() == c.loss_mask.tolist()
    assert batch.advantages[0, p - 1 : p + 7].tolist() == (2.0 * c.loss_mask).tolist()
    assert batch.loss_mask.sum() == 6


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_trainer_scores_exactly_the_samplers_ids_with_its_logprobs(temperature):
    """A real model and the static sampler: every turn's prompt is the episode's ids so far
    (nothing re-tokenised), and the trainer's recomputed logprobs on the batch equal the
    sampler's on every model token, as for a single turn."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    spy = Spy(JaxSampler(max_new_tokens=3, temperature=temperature))
    sampler = EpisodeSampler(sampler=spy, environment=GuessEnvironment(max_turns=4))
    sampler.setup(model, TOK)
    prompts = [secret_prompt(s) for s in (1, 8)]
    out = sampler.generate(prompts, 3, seed=7)
    retokenized = 0
    for prompt_ids, _ in spy.turns:  # the turn prompt is a prefix of its episode, id for id
        episodes = [np.r_[p.tokens, c.tokens] for p, cs in zip(prompts, out) for c in cs]
        match = [e for e in episodes if e[: len(prompt_ids)].tolist() == prompt_ids.tolist()]
        retokenized += 0 if match else len(prompt_ids)
    assert retokenized == 0 and len(spy.turns) >= 6
    groups = [Group(p, cs, np.zeros(3, np.float32)) for p, cs in zip(prompts, out)]
    batch = make_batch(groups, np.zeros((2, 3)), completion_len=sampler.max_new_tokens)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, temperature)
    on = batch.loss_mask > 0
    assert on.sum() == sum(int(c.loss_mask.sum()) for cs in out for c in cs)
    np.testing.assert_allclose(np.asarray(logp)[on], batch.old_logprobs[on], atol=1e-5)
    assert np.all(batch.old_logprobs[~on] == 0)
