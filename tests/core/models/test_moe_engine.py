"""The slot engine records each token's experts (routing replay, R3) as the static sampler
does, through shared prefills and partial rollouts, and the trainer's forward routed by that
record reproduces the engine's logprobs."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.routing_replay import replayed_logprobs
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.trainer.batches import make_batch
from rlax.core.types import PARTIAL, Group, PartialGroup
from rlax.plugins.samplers.engine import SlotEngine

from .test_moe_sampler import CFG, PROMPTS, TOK

N = 5  # samples per prompt: 10 rows through 4 slots, so slots take new rows mid-call


def _engine(model: Transformer) -> SlotEngine:
    engine = SlotEngine(
        slots=4, chunk=3, refill_at=1, max_new_tokens=7, stop_at_eos=False, max_prompt_tokens=8
    )
    engine.setup(model, TOK)
    return engine


@pytest.fixture(scope="module")
def sampled():
    """(model, groups): 2 prompts x N samples, each prompt prefilled once for its rows."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    engine = _engine(model)
    out = engine.generate(PROMPTS, N, seed=3)
    assert engine.prefilled_tokens == sum(len(p.tokens) - 1 for p in PROMPTS)  # shared
    return model, [Group(p, cs, np.zeros(N, np.float32)) for p, cs in zip(PROMPTS, out)]


def _own_routes(model: Transformer, row: np.ndarray) -> np.ndarray:
    """[T, R, k]: the experts one forward over the whole row picks."""
    mask = jnp.ones((1, len(row)), bool)
    _, _, own = model.routed_hidden_states(
        jnp.asarray(row[None]), positions_from_mask(mask), causal_mask(mask)
    )
    return np.asarray(own.ids[0])


def _agreement(model: Transformer, groups) -> float:
    """The fraction of recorded tokens (all but each row's last) routed as one forward
    over the row routes them; asserts the record's shape and that the last token has -1."""
    agree = []
    for group in groups:
        for c in group.completions:
            row = np.concatenate([group.prompt.tokens, c.tokens])
            assert c.routes.dtype == np.int16 and c.routes.shape == (len(row), 2, 2)
            assert (c.routes[-1] == -1).all()  # the last token is never fed
            assert ((c.routes[:-1] >= 0) & (c.routes[:-1] < 6)).all()
            same = np.sort(_own_routes(model, row)[:-1], -1) == np.sort(c.routes[:-1], -1)
            agree.append(same.all(-1).mean())
    return float(np.mean(agree))


def _replay_matches(model: Transformer, groups) -> None:
    batch = make_batch(groups, np.zeros((len(groups), N)), completion_len=7)
    assert batch.routes is not None and batch.routes.shape[:2] == batch.tokens.shape
    logp, _ = replayed_logprobs(model, batch.tokens, batch.attention_mask, batch.routes, 1.0, 1024)
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], batch.old_logprobs[mask], atol=1e-5)


def test_each_completion_carries_its_rows_experts(sampled):
    model, groups = sampled
    # Up to float rounding of prefill and decode, which may swap a near-tie (as the static
    # sampler's test allows).
    assert _agreement(model, groups) > 0.97


def test_the_replayed_forward_reproduces_the_engines_logprobs(sampled):
    _replay_matches(*sampled)


def test_a_shared_prompts_samples_carry_its_prefills_routes(sampled):
    _, groups = sampled
    for group in groups:
        p = len(group.prompt.tokens)
        first = group.completions[0].routes[: p - 1]  # the prefill's part (not the feed token)
        for c in group.completions[1:]:
            np.testing.assert_array_equal(c.routes[: p - 1], first)


def test_partial_rows_carry_their_routes_and_continue_whole():
    model = Transformer(CFG, rngs=nnx.Rngs(2))
    engine = _engine(model)
    calls = iter(range(100))
    cut = engine.generate_groups(PROMPTS, N, seed=5, interrupt=lambda: next(calls) == 2)
    partial = [g for g in cut if isinstance(g, PartialGroup)]
    assert partial  # the notice came while rows were in flight
    cut_rows = [c for g in partial for c in g.rows if c.finish_reason == PARTIAL and len(c.tokens)]
    assert cut_rows  # some row was cut after generating
    for g, prompt in zip(cut, PROMPTS):
        for c in g.rows if isinstance(g, PartialGroup) else g:
            if len(c.tokens):  # a row never placed has no record yet
                assert len(c.routes) == len(prompt.tokens) + len(c.tokens)
    out = engine.generate_groups(
        PROMPTS, N, seed=6, partials=[g if isinstance(g, PartialGroup) else None for g in cut]
    )
    groups = [
        Group(p, g if isinstance(g, tuple) else new, np.zeros(N, np.float32))
        for p, g, new in zip(PROMPTS, cut, out)
    ]
    before = {id(c): c for c in cut_rows}
    for g_cut, g_new in zip(cut, out):
        if not isinstance(g_cut, PartialGroup):
            continue
        for old, new in zip(g_cut.rows, g_new):
            if id(old) in before:  # the record of the tokens it had is kept
                np.testing.assert_array_equal(new.routes[: len(old.routes) - 1], old.routes[:-1])
                assert (new.routes[len(old.routes) - 1] >= 0).all()  # fed on resuming
    assert _agreement(model, groups) > 0.97
    _replay_matches(model, groups)
