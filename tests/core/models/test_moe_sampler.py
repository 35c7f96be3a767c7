"""The static sampler records each token's experts (routing replay, R3), and the trainer's
forward routed by that record reproduces the sampler's logprobs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.routing_replay import replayed_logprobs
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.trainer.batches import make_batch
from rlax.core.types import Group, Prompt
from rlax.plugins.samplers.jax_sampler import JaxSampler

TOK = CharTokenizer("0123456789+=")
CFG = TransformerConfig(
    vocab_size=TOK.vocab_size,
    num_layers=3,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=48,
    moe=MoeConfig(num_experts=6, experts_per_token=2, expert_mlp_dim=16, dense_layers=(1,)),
)
PROMPTS = [Prompt(id=t, text=t, tokens=TOK.encode(t, bos=True), answer="") for t in ("12+3=", "7=")]


@pytest.fixture(scope="module")
def sampled():
    """(model, groups): 2 prompts x 8 samples (a shared prefill: 2 prompts for 16 rows)."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    sampler = JaxSampler(max_new_tokens=6, temperature=1.0, stop_at_eos=False)
    sampler.setup(model, TOK)
    out = sampler.generate(PROMPTS, 8, seed=3)
    return model, [Group(p, cs, np.zeros(8, np.float32)) for p, cs in zip(PROMPTS, out)]


def test_each_completion_carries_its_rows_experts(sampled):
    model, groups = sampled
    agree = []
    for group in groups:
        for c in group.completions:
            row = np.concatenate([group.prompt.tokens, c.tokens])
            assert c.routes.dtype == np.int16
            assert c.routes.shape == (len(row), 2, 2)  # 2 sparse layers, top-2
            assert ((c.routes >= 0) & (c.routes < 6)).all()
            # The same routing as one forward over the whole row (up to float rounding of
            # prefill and decode, which may swap a near-tie).
            mask = jnp.ones((1, len(row)), bool)
            _, _, own = model.routed_hidden_states(
                jnp.asarray(row[None]), positions_from_mask(mask), causal_mask(mask)
            )
            same = np.sort(np.asarray(own.ids[0]), -1) == np.sort(c.routes, -1)
            agree.append(same.all(-1).mean())
    assert np.mean(agree) > 0.97


def test_the_replayed_forward_reproduces_the_samplers_logprobs(sampled):
    model, groups = sampled
    batch = make_batch(groups, np.zeros((2, 8)), completion_len=6)
    assert batch.routes is not None and batch.routes.shape[:2] == batch.tokens.shape
    logp, _ = replayed_logprobs(model, batch.tokens, batch.attention_mask, batch.routes, 1.0, 1024)
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], batch.old_logprobs[mask], atol=1e-5)


def test_a_perturbed_router_still_routes_by_the_record(sampled):
    model, groups = sampled
    batch = make_batch(groups, np.zeros((2, 8)), completion_len=6)
    for i in CFG.moe_layers:  # the trainer's router now prefers other experts
        model.blocks[i].mlp.router.kernel[...] = -model.blocks[i].mlp.router.kernel[...]
    try:
        mask = jnp.asarray(batch.attention_mask)
        tokens = jnp.asarray(batch.tokens)
        args = (tokens, positions_from_mask(mask), causal_mask(mask))
        _, _, own = model.routed_hidden_states(*args)
        _, _, replayed = model.routed_hidden_states(*args, replay=jnp.asarray(batch.routes))
    finally:
        for i in CFG.moe_layers:
            model.blocks[i].mlp.router.kernel[...] = -model.blocks[i].mlp.router.kernel[...]
    real = batch.attention_mask
    recorded = batch.routes[real]
    assert (np.sort(np.asarray(own.ids)[real], -1) != np.sort(recorded, -1)).any(-1).mean() > 0.9
    np.testing.assert_array_equal(np.asarray(replayed.ids)[real], recorded)


def test_the_slot_engine_runs_a_moe_model_with_the_trainers_logprobs():
    from rlax.core.models.transformer import sequence_logprobs
    from rlax.plugins.samplers.engine import SlotEngine

    model = Transformer(CFG, rngs=nnx.Rngs(1))
    engine = SlotEngine(slots=4, chunk=4, max_new_tokens=6, stop_at_eos=False, max_prompt_tokens=8)
    engine.setup(model, TOK)
    out = engine.generate(PROMPTS, 3, seed=0)
    groups = [Group(p, cs, np.zeros(3, np.float32)) for p, cs in zip(PROMPTS, out)]
    assert all(c.routes is not None for g in groups for c in g.completions)  # test_moe_engine
    batch = make_batch(groups, np.zeros((2, 3)), completion_len=6)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 1.0)
    mask = batch.loss_mask > 0
    close = np.abs(np.asarray(logp)[mask] - batch.old_logprobs[mask]) < 1e-4
    assert close.mean() > 0.95  # the same network (a near-tie may route a token apart)
