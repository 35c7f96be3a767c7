"""Sampling truth: the recorded logprob is the law tokens are drawn by, and the trainer
recomputes it.

For each sampler (the token choice alone, the static sampler, the slot engine) with
top-k / top-p / temperature set, many draws from one distribution:

- each token's empirical frequency matches exp(its recorded logprob): Pearson's
  chi-square over the kept set is below its 0.999 quantile (level 0.001; the seeds
  are fixed, so the outcome is deterministic);
- the recorded probabilities sum to 1 over the kept set (the tokens whose full
  logprob is at least the recorded floor), every kept token is drawn and no
  other;
- the trainer's logprob of the same tokens, truncated by the recorded floors,
  equals the recorded one (<= 1e-5, float32), padded and packed, and its step
  measures no mismatch; without the floors it measures the truncation's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

from rlax.core.models.config import TransformerConfig
from rlax.core.models.logprobs import kept_logprobs
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import (
    Transformer,
    causal_mask,
    positions_from_mask,
    sequence_logprobs,
)
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.settings import TrainerSettings
from rlax.core.trainer.step import Trainer
from rlax.core.types import Group, Prompt
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.samplers.engine import SlotEngine
from rlax.plugins.samplers.jax_sampler import JaxSampler
from rlax.plugins.samplers.sampling import sample_token

LEVEL = 0.001  # the chi-square test's level: fails a correct sampler 1 time in 1000
TOK = CharTokenizer("0123456789+=")
CFG = TransformerConfig(
    vocab_size=TOK.vocab_size,
    num_layers=2,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
)
# (top_k, top_p, temperature): each cuts at the random model's first position.
SETTINGS = [(5, 1.0, 0.8), (0, 0.6, 1.0), (6, 0.8, 0.7)]


def prompt(text: str) -> Prompt:
    return Prompt(id=text, text=text, tokens=TOK.encode(text, bos=True), answer="")


@pytest.fixture(scope="module")
def model():
    # Its first token's distribution: 0.20, 0.18, 0.15, 0.11, 0.09, 0.06, ... (15 tokens).
    return Transformer(CFG, rngs=nnx.Rngs(4))


def assert_law(tokens: np.ndarray, logps: np.ndarray, floors: np.ndarray, full: np.ndarray):
    """Draws of one distribution: ``tokens`` [N] with their recorded logprobs and floors [N];
    ``full`` [V] the full tempered logprobs. The chi-square law, sum to 1, support."""
    # One position, one kept set (rows differ by float rounding: batched prefills).
    floor = float(floors[0])
    assert np.isfinite(floor) and np.allclose(floors, floor, atol=1e-5)
    kept = np.flatnonzero(full >= floor - 1e-5)
    assert 1 < len(kept) < len(full)  # the setting cut something and kept a choice
    recorded = {}
    for t, lp in zip(tokens.tolist(), logps.tolist()):
        assert recorded.setdefault(t, lp) == pytest.approx(lp, abs=1e-5)  # one value a token
    assert sorted(recorded) == kept.tolist()  # every kept token drawn, no other
    probs = np.exp([recorded[t] for t in kept])
    assert probs.sum() == pytest.approx(1.0, abs=1e-5)
    counts = np.bincount(tokens, minlength=len(full))[kept]
    chi2 = float(np.sum((counts - len(tokens) * probs) ** 2 / (len(tokens) * probs)))
    assert chi2 < stats.chi2.ppf(1 - LEVEL, len(kept) - 1), (chi2, counts, probs)
    # The law the full logprob would claim is rejected: truncation is what was sampled.
    expected = len(tokens) * np.exp(full[kept])
    wrong = float(np.sum((counts - expected) ** 2 / expected))
    assert wrong > stats.chi2.ppf(1 - LEVEL, len(kept) - 1)


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
@pytest.mark.parametrize("top_k,top_p,temperature", SETTINGS)
def test_token_choice_frequencies_follow_the_recorded_logprobs(method, top_k, top_p, temperature):
    logits = jnp.asarray([[2.0, 1.5, 1.2, 0.9, 0.4, 0.0, -0.3, -1.0, -2.0, 0.7]])
    n = 20_000
    tok, logp, floor = sample_token(
        jnp.tile(logits, (n, 1)),
        jax.random.key(11),
        jnp.float32(temperature),
        top_k=top_k,
        top_p=top_p,
        method=method,
    )
    full = np.asarray(jax.nn.log_softmax(logits[0] / temperature))
    assert_law(np.asarray(tok), np.asarray(logp), np.asarray(floor), full)


def first_tokens(sampler, model, draws: int):
    """``draws`` first tokens of one prompt: tokens, logprobs, floors [draws] and the
    model's full tempered logprobs there [V]."""
    sampler.setup(model, TOK)
    p = prompt("12+3=")
    comps = [c for seed in range(draws // 512) for c in sampler.generate([p], 512, seed=seed)[0]]
    tokens = np.asarray([c.tokens[0] for c in comps])
    logps = np.asarray([c.logprobs[0] for c in comps])
    floors = np.asarray([c.kept_floor[0] for c in comps])
    mask = jnp.ones((1, len(p.tokens)), bool)
    logits, _ = model(jnp.asarray(p.tokens)[None], positions_from_mask(mask), causal_mask(mask))
    full = np.asarray(jax.nn.log_softmax(logits[0, -1] / sampler.temperature))
    return tokens, logps, floors, full


def make_sampler(kind: str, **kw):
    kw = dict(kw, max_new_tokens=1, stop_at_eos=False)
    if kind == "engine":
        return SlotEngine(slots=64, chunk=1, max_prompt_tokens=8, **kw)
    return JaxSampler(**kw)


@pytest.mark.parametrize("kind", ["static", "engine"])
@pytest.mark.parametrize("top_k,top_p,temperature", SETTINGS)
def test_sampler_frequencies_follow_the_recorded_logprobs(model, kind, top_k, top_p, temperature):
    sampler = make_sampler(kind, top_k=top_k, top_p=top_p, temperature=temperature)
    assert_law(*first_tokens(sampler, model, 4096))


def rollouts(sampler, model):
    sampler.setup(model, TOK)
    prompts = [prompt("7+5="), prompt("123+45="), prompt("1=")]
    out = sampler.generate(prompts, 4, seed=3)
    return [Group(p, cs, np.arange(4, dtype=np.float32)) for p, cs in zip(prompts, out)]


@pytest.mark.parametrize("kind", ["static", "engine"])
def test_the_trainer_recomputes_the_recorded_truncated_logprobs(model, kind):
    kw = {"top_k": 6, "top_p": 0.8, "temperature": 0.7, "stop_at_eos": False}
    sampler = (
        SlotEngine(slots=8, chunk=4, max_prompt_tokens=8, max_new_tokens=10, **kw)
        if kind == "engine"
        else JaxSampler(max_new_tokens=10, **kw)
    )
    groups = rollouts(sampler, model)
    batch = make_batch(groups, np.zeros((3, 4)), completion_len=10)
    assert batch.kept_floor is not None
    mask = batch.loss_mask > 0
    assert np.isfinite(batch.kept_floor[mask]).mean() > 0.9  # most positions were cut
    logp, _ = sequence_logprobs(
        model, batch.tokens, batch.attention_mask, 0.7, floor=jnp.asarray(batch.kept_floor)
    )
    np.testing.assert_allclose(np.asarray(logp)[mask], batch.old_logprobs[mask], atol=1e-5)
    # The full distribution's logprobs are lower by the cut mass: not what was recorded.
    full, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 0.7)
    assert np.mean(batch.old_logprobs[mask] - np.asarray(full)[mask]) > 0.05


@pytest.mark.parametrize("packing", ["padded", "packed"])
def test_the_train_step_measures_no_mismatch_under_the_same_truncation(model, packing):
    sampler = JaxSampler(max_new_tokens=10, top_k=6, top_p=0.8, temperature=0.7)
    groups = rollouts(sampler, model)
    batch = make_batch(groups, np.ones((3, 4)), completion_len=10)
    settings = TrainerSettings(packing=packing)
    trainer = Trainer(model, grpo(), optax.sgd(0.0), temperature=0.7, settings=settings)
    assert trainer.step(batch)["mismatch_abs_logp"] < 1e-5
    # The same rollouts trained against the full distribution: the ratio is off by the cut.
    full = dataclasses.replace(batch, kept_floor=None)
    assert trainer.step(full)["mismatch_abs_logp"] > 0.05


@pytest.mark.parametrize("kind", ["static", "engine"])
def test_full_recording_is_the_full_distribution_and_says_what_was_sampled(model, kind):
    kw = {"top_k": 6, "top_p": 0.8, "temperature": 0.7, "stop_at_eos": False}

    def make(recorded):
        if kind == "engine":
            return SlotEngine(
                slots=8,
                chunk=4,
                max_prompt_tokens=8,
                max_new_tokens=10,
                recorded_logprobs=recorded,
                **kw,
            )
        return JaxSampler(max_new_tokens=10, recorded_logprobs=recorded, **kw)

    groups = rollouts(make("full"), model)
    truncated = rollouts(make("truncated"), model)  # the same seed: the same draws
    for g, t in zip(groups, truncated):
        for c, ct in zip(g.completions, t.completions):
            assert c.kept_floor is None and c.sampled_logprobs is not None
            np.testing.assert_array_equal(c.tokens, ct.tokens)
            np.testing.assert_allclose(c.sampled_logprobs, ct.logprobs, atol=1e-5)
    batch = make_batch(groups, np.zeros((3, 4)), completion_len=10)
    assert batch.kept_floor is None and batch.sampled_logprobs is not None
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 0.7)
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], batch.old_logprobs[mask], atol=1e-5)


def test_the_step_s_mismatch_is_against_the_distribution_sampled_from(model):
    """Recorded full while cutting: the ratio the algorithm uses is 1, but the tokens came
    from the truncated distribution; the mismatch metrics say so, and say nothing when the
    recorded distribution is the sampled one."""
    trainer = Trainer(model, grpo(), optax.sgd(0.0), temperature=0.7)
    kw = {"max_new_tokens": 10, "top_k": 6, "top_p": 0.8, "temperature": 0.7}
    metrics = {}
    for recorded in ("full", "truncated"):
        groups = rollouts(JaxSampler(recorded_logprobs=recorded, **kw), model)
        metrics[recorded] = trainer.step(make_batch(groups, np.ones((3, 4)), completion_len=10))
    assert metrics["full"]["ratio_out_of_band"] > 0.3
    assert metrics["full"]["mismatch_abs_logp"] > 0.05
    assert metrics["truncated"]["ratio_out_of_band"] == 0.0
    assert metrics["truncated"]["mismatch_abs_logp"] < 1e-5


def test_kept_logprobs_by_hand_and_the_target_is_always_kept():
    logp = jnp.log(jnp.asarray([0.5, 0.3, 0.15, 0.05]))
    floor = jnp.log(0.15)  # keeps 0.5, 0.3, 0.15: mass 0.95
    got = kept_logprobs(logp[None].repeat(4, 0), jnp.arange(4), jnp.full(4, floor))
    # Token 3 is below the floor (a policy that moved since sampling): kept as the target,
    # its set is the three plus itself, mass 1.
    want = np.log([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.05 / 1.0])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    none = kept_logprobs(logp[None], jnp.asarray([1]), jnp.asarray([-jnp.inf]))
    np.testing.assert_allclose(np.asarray(none), np.log([0.3]), rtol=1e-6)


def test_the_kept_sets_travel_over_the_wire_and_bad_ones_are_refused(model):
    from rlax.core.param_server import codec
    from rlax.core.param_server.codec import WireError

    sampler = JaxSampler(max_new_tokens=10, top_k=6, top_p=0.8, temperature=0.7)
    group = rollouts(sampler, model)[1]
    msg = codec.group_to_msg(group, "L")
    codec.check_group(msg, max_completions=4, max_tokens=10, newest_version=0)
    back = codec.msg_to_group(msg)
    for a, b in zip(group.completions, back.completions):
        assert a.kept_floor is not None and b.kept_floor is not None
        assert a.kept_floor.tobytes() == b.kept_floor.tobytes()
    full = rollouts(JaxSampler(max_new_tokens=10, top_k=6, recorded_logprobs="full"), model)[1]
    for a, b in zip(
        full.completions, codec.msg_to_group(codec.group_to_msg(full, "L")).completions
    ):
        assert a.sampled_logprobs is not None and b.sampled_logprobs is not None
        assert a.sampled_logprobs.tobytes() == b.sampled_logprobs.tobytes()
    for bad in (b"\0\0\0", np.float32([0.5] * 10).tobytes(), np.float32([np.nan] * 10).tobytes()):
        msg.completions[0].kept_floor = bad
        with pytest.raises(WireError, match="kept_floor"):
            codec.check_group(msg, max_completions=4, max_tokens=10, newest_version=0)


def test_an_agent_transcript_keeps_each_reply_s_kept_sets(model):
    from rlax.core.rollout.agents.transcript import Transcript

    sampler = JaxSampler(max_new_tokens=6, top_k=6, top_p=0.8, temperature=0.7)
    reply = rollouts(sampler, model)[0].completions[0]
    t = Transcript("episode")
    first = np.asarray(TOK.encode("7+5=", bos=True), np.int32)
    t.request(first)
    t.reply(reply)
    t.request(np.concatenate([first, reply.tokens, TOK.encode("1")]))  # an observation
    t.reply(reply)
    ((_, c),) = t.completions()
    n = len(reply.tokens)
    assert c.kept_floor is not None
    np.testing.assert_array_equal(c.kept_floor[:n], reply.kept_floor)
    assert c.kept_floor[n] == -np.inf  # the observation: not sampled, nothing cut
    np.testing.assert_array_equal(c.kept_floor[n + 1 :], reply.kept_floor)
    assert all(turn.kept_floor is not None for _, turn in t.turns())


def test_a_top_k_above_the_vocabulary_cuts_nothing():
    logits = jnp.asarray([[2.0, 1.0, 0.0]] * 4)
    tok, logp, floor = sample_token(logits, jax.random.key(0), jnp.float32(1.0), top_k=20)
    want = jax.nn.log_softmax(logits)[jnp.arange(4), tok]
    np.testing.assert_allclose(logp, want, rtol=1e-6)
    assert np.all(np.asarray(floor) == -np.inf)
