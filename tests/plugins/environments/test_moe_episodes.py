"""Multi-turn episodes of a mixture-of-experts policy carry routes (routing replay): the
last model turn's record, which reproduces the episode's logprobs when the trainer replays it."""

from __future__ import annotations

import numpy as np
from flax import nnx

from rlax.core.episodes import Observation
from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.routing_replay import replayed_logprobs
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer
from rlax.core.trainer.batches import make_batch
from rlax.core.types import Group, Prompt
from rlax.plugins.environments.guess import ALPHABET, GuessEnvironment
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
    mlp_dim=48,
    moe=MoeConfig(num_experts=6, experts_per_token=2, expert_mlp_dim=16),
)


class Hints(GuessEnvironment):
    """Every turn gets an observation: every episode runs all its turns."""

    def start(self, prompt, tokenizer):
        episode = super().start(prompt, tokenizer)
        step = episode.step
        episode.step = lambda text: step(text) or Observation(tokenizer.encode("<"), "<")
        return episode


def test_episodes_carry_the_last_turns_routes_and_replay_to_their_logprobs():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    env = Hints(max_turns=3, max_episode_tokens=12)
    turns = JaxSampler(max_new_tokens=3, temperature=1.0, stop_tokens=range(2, TOK.vocab_size))
    sampler = EpisodeSampler(sampler=turns, environment=env)
    sampler.setup(model, TOK)
    prompts = [
        Prompt(id=str(i), text="?", tokens=TOK.encode("?", bos=True), answer=str(i)) for i in (3, 7)
    ]
    out = sampler.generate(prompts, 4, seed=0)
    groups = [Group(p, cs, np.zeros(4, np.float32)) for p, cs in zip(prompts, out)]
    completions = [c for g in groups for c in g.completions]
    assert max(c.episode["turns"] for c in completions) > 1
    for g in groups:
        for c in g.completions:
            assert c.routes.shape == (len(g.prompt.tokens) + len(c.tokens), 2, 2)
            last = np.flatnonzero(c.loss_mask)[-1]  # the last model token
            tail = c.routes[len(g.prompt.tokens) + last + 1 :]
            assert (tail == -1).all()  # observations after the last turn: none recorded
            assert (c.routes[: len(g.prompt.tokens) + last] >= 0).all()
    batch = make_batch(groups, np.zeros((2, 4)), completion_len=12)
    logp, _ = replayed_logprobs(model, batch.tokens, batch.attention_mask, batch.routes, 1.0, 1024)
    on = batch.loss_mask > 0
    diff = np.abs(np.asarray(logp)[on] - batch.old_logprobs[on])
    # Exact but where an earlier turn's prefill and decode rounding split a near-tie.
    assert (diff < 1e-5).mean() > 0.97 and diff.max() < 0.5
