"""Multi-turn episodes through a real worker and a real parameter server: the trainer
gets exactly the ids the sampler produced, and its logprobs match the sampler's as
closely as for single-turn completions."""

from __future__ import annotations

import numpy as np
from flax import nnx

from rlax.core.episodes import Observation
from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.rollout.groups import episode_metrics
from rlax.core.trainer.batches import make_batch
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker
from rlax.plugins.environments.guess import ALPHABET, GuessEnvironment, GuessReward
from rlax.plugins.environments.runner import EpisodeSampler
from rlax.plugins.samplers.jax_sampler import JaxSampler

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
TEMPERATURE = 0.8


class Hints(GuessEnvironment):
    """The guessing game, but any turn gets a hint (an untrained model rarely writes a
    number): every episode runs all its turns."""

    def start(self, prompt, tokenizer):
        episode = super().start(prompt, tokenizer)
        step = episode.step
        episode.step = lambda text: step(text) or Observation(tokenizer.encode("<"), "<")
        return episode


def turn_sampler(**kw):
    # Every id but pad and bos stops a turn: turns of one token that end with "stop".
    return JaxSampler(
        max_new_tokens=3, temperature=TEMPERATURE, stop_tokens=range(2, TOK.vocab_size), **kw
    )


class Recording:
    """Wraps a sampler; keeps every completion it returned, by prompt id."""

    def __init__(self, inner):
        self.inner, self.made = inner, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, n, *, seed):
        out = self.inner.generate(prompts, n, seed=seed)
        self.made.update({p.id: cs for p, cs in zip(prompts, out)})
        return out


def serve_and_take(ps, model, sampler):
    state = nnx.state(model)
    plan = WirePlan.for_tree(state)
    ps.client.push(plan, state, 0)
    sampler.setup(model, TOK)
    w = Worker(
        ps.client,
        sampler,
        GuessReward(),
        [],
        group_size=3,
        prompts_per_lease=2,
        reload_staleness=0,
        worker_id="w",
        seed=1,
    )
    assert w.run_once(plan) == 2  # one lease, whole episodes
    _, groups, dropped = ps.client.take(2, current_version=0, max_staleness=0, wait_s=0)
    assert dropped == 0 and len(groups) == 2
    return groups


def mismatch(model, groups, completion_len):
    batch = make_batch(groups, np.zeros((len(groups), 3)), completion_len=completion_len)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, TEMPERATURE)
    on = batch.loss_mask > 0
    return float(np.max(np.abs(np.asarray(logp)[on] - batch.old_logprobs[on]))), batch


def test_episode_ids_reach_the_trainer_unchanged_and_logprobs_match_as_single_turn(make_ps):
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    env = Hints(max_turns=3, max_episode_tokens=12)
    episodes = Recording(EpisodeSampler(sampler=turn_sampler(), environment=env))
    groups = serve_and_take(make_ps(), model, episodes)

    for g in groups:  # the ids, mask and logprobs the trainer took are the sampler's own
        made = episodes.made[g.prompt.id]
        for got, want in zip(g.completions, made):
            assert got.tokens.tolist() == want.tokens.tolist()
            assert got.loss_mask.tolist() == want.loss_mask.tolist()
            np.testing.assert_array_equal(got.logprobs, want.logprobs)
        assert g.rewards.tolist() == [c.episode["reward"] for c in made]
    turns = [c.episode["turns"] for g in groups for c in g.completions]
    assert max(turns) > 1 and 0 < sum(c.loss_mask.sum() for g in groups for c in g.completions)
    multi, batch = mismatch(model, groups, env.limits.max_episode_tokens)
    assert (batch.loss_mask == 0).sum() > 0
    assert episode_metrics(groups)["turns_mean"] == np.mean(turns)

    single = Recording(JaxSampler(max_new_tokens=3, temperature=TEMPERATURE))
    one_turn, _ = mismatch(model, serve_and_take(make_ps(), model, single), 3)
    assert multi <= max(2 * one_turn, 1e-5), (multi, one_turn)
