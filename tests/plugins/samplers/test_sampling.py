"""Token choice (top-k, top-p, temperature) on hand-computed logits; stop tokens; static shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.types import Prompt
from rlax.plugins.samplers.jax_sampler import JaxSampler
from rlax.plugins.samplers.sampling import (
    inverse_cdf_sample,
    restrict_top_k,
    restrict_top_p,
    sample_token,
)

NEG = -np.inf
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


def prompt(text):
    return Prompt(id=text, text=text, tokens=TOK.encode(text, bos=True), answer="")


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def test_top_k_keeps_the_k_largest():
    logits = jnp.array([[1.0, 3.0, 2.0, 0.0]])
    np.testing.assert_array_equal(restrict_top_k(logits, 2), [[NEG, 3.0, 2.0, NEG]])
    np.testing.assert_array_equal(restrict_top_k(logits, 4), logits)


def test_top_p_keeps_the_smallest_nucleus():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    logits = jnp.log(jnp.array([probs]))
    # sorted: .5, .3, .15, .05; mass before each: 0, .5, .8, .95
    kept = lambda p: np.isfinite(np.asarray(restrict_top_p(logits, p)))[0].tolist()
    assert kept(0.7) == [False, True, False, True]
    assert kept(0.5) == [False, True, False, False]  # mass before .3 is .5, not < .5
    assert kept(0.81) == [False, True, True, True]
    assert kept(1.0) == [True, True, True, True]


def test_sampled_tokens_stay_in_the_allowed_set_and_full_logprob_is_the_tempered_one():
    logits = jax.random.normal(jax.random.key(0), (256, 40)) * 3
    for top_k, top_p in ((1, 1.0), (5, 1.0), (0, 0.6), (3, 0.9)):
        tok, logp, floor = sample_token(
            logits, jax.random.key(1), jnp.float32(0.7), top_k=top_k, top_p=top_p, recorded="full"
        )
        allowed = logits / 0.7
        if top_k:
            allowed = restrict_top_k(allowed, top_k)
        if top_p < 1:
            allowed = restrict_top_p(allowed, top_p)
        # "full": no floor travels, but the kept set's log mass under the full distribution
        # does, so logprob - mass is the logprob under the distribution drawn from.
        full = jax.nn.log_softmax(logits / 0.7)
        mass = jax.nn.logsumexp(jnp.where(jnp.isfinite(allowed), full, -jnp.inf), axis=-1)
        np.testing.assert_allclose(floor, mass, rtol=1e-6, atol=1e-6)
        assert np.all(
            np.isfinite(np.take_along_axis(np.asarray(allowed), np.asarray(tok)[:, None], 1))
        )
        want = jax.nn.log_softmax(logits / 0.7)[jnp.arange(256), tok]
        np.testing.assert_allclose(logp, want, rtol=1e-6)
        if top_k == 1:
            np.testing.assert_array_equal(tok, jnp.argmax(logits, -1))


def test_top_p_frequencies_follow_the_renormalised_nucleus():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.log(jnp.tile(probs, (20_000, 1)))
    tok, _, _ = sample_token(logits, jax.random.key(2), jnp.float32(1.0), top_p=0.7)
    freq = np.bincount(np.asarray(tok), minlength=4) / 20_000
    np.testing.assert_allclose(freq, [0.625, 0.375, 0, 0], atol=0.015)


def test_stop_tokens_end_completions(model):
    stops = [int(i) for i in TOK.encode("13579")]
    s = JaxSampler(max_new_tokens=8, stop_tokens=stops)
    s.setup(model, TOK)
    out = s.generate([prompt("12+3=")], 32, seed=0)[0]
    assert any(c.finish_reason == "stop" for c in out)
    for c in out:
        hits = np.flatnonzero(np.isin(c.tokens, stops + [TOK.eos_id]))
        if c.finish_reason == "stop":
            assert list(hits) == [len(c.tokens) - 1]
        else:
            assert len(hits) == 0 and len(c.tokens) == 8


def test_steady_state_never_recompiles(model):
    s = JaxSampler(max_new_tokens=4, top_p=0.9, top_k=5, prompt_bucket=8)
    s.setup(model, TOK)
    s.generate([prompt("1+1=")], 2, seed=0)  # rows bucket 8, prompt bucket 8
    assert s.compiles == 1
    # Different prompt lengths (within 8), prompt counts, group sizes, seeds, weights.
    for seed, (texts, n) in enumerate([(["12+3="], 8), (["1=", "22+33="], 3), (["9+9="] * 4, 2)]):
        s.generate([prompt(t) for t in texts], n, seed=seed)
    s.load_weights(nnx.state(Transformer(CFG, rngs=nnx.Rngs(1))), version=1)
    s.generate([prompt("5=")], 5, seed=9)
    assert s.compiles == 1
    s.generate([prompt("1234+5678=")], 4, seed=0)  # a longer prompt: one new bucket
    assert s.compiles == 2


def test_top_k_one_is_greedy_whatever_the_seed(model):
    s = JaxSampler(max_new_tokens=5, top_k=1)
    s.setup(model, TOK)
    a = s.generate([prompt("3+4=")], 4, seed=0)[0]
    b = s.generate([prompt("3+4=")], 4, seed=1)[0]
    assert len({tuple(c.tokens) for c in a + b}) == 1


@pytest.mark.parametrize("block", [4, 256])
def test_inverse_cdf_frequencies_and_zero_probability_tokens(block):
    probs = np.array([0.1, 0.0, 0.4, 0.2, 0.3] + [0.0] * 11)  # 16 entries, a padded last block
    logits = jnp.log(jnp.tile(jnp.asarray(probs), (40_000, 1)))
    tok = np.asarray(inverse_cdf_sample(jax.random.key(3), logits, block=block))
    freq = np.bincount(tok, minlength=16) / 40_000
    np.testing.assert_allclose(freq, probs, atol=0.01)
    assert set(np.unique(tok)) <= {0, 2, 3, 4}


def test_inverse_cdf_respects_top_k_and_logprobs():
    logits = jax.random.normal(jax.random.key(5), (128, 3000)) * 2
    tok, logp, _ = sample_token(
        logits, jax.random.key(6), jnp.float32(1.3), top_k=7, method="inverse_cdf", recorded="full"
    )
    kth = jax.lax.top_k(logits, 7)[0][:, -1]
    assert np.all(np.asarray(logits[jnp.arange(128), tok] >= kth))
    want = jax.nn.log_softmax(logits / 1.3)[jnp.arange(128), tok]
    np.testing.assert_allclose(logp, want, rtol=1e-6)


def test_auto_method_by_vocabulary(model):
    s = JaxSampler()
    assert s._method(TOK.vocab_size) == "gumbel"  # the toy models keep their exact samples
    assert s._method(49152) == "inverse_cdf"
    with pytest.raises(ValueError, match="method"):
        JaxSampler(method="nope")


def test_inverse_cdf_unrestricted_path_logprobs_and_frequencies():
    probs = np.array([0.1, 0.0, 0.4, 0.2, 0.3] + [0.0] * 400)
    logits = jnp.log(jnp.tile(jnp.asarray(probs), (40_000, 1))) * 0.5  # T = 0.5 undoes the 0.5
    tok, logp, _ = sample_token(logits, jax.random.key(7), jnp.float32(0.5), method="inverse_cdf")
    freq = np.bincount(np.asarray(tok), minlength=5)[:5] / 40_000
    np.testing.assert_allclose(freq, probs[:5], atol=0.01)
    np.testing.assert_allclose(logp, np.log(probs[np.asarray(tok)]), rtol=1e-5)


def test_large_vocabulary_path_logprobs_equal_a_full_forward():
    """Vocab > 4096: inverse-CDF draws and last-position prefill logits, same logprobs."""
    from rlax.core.models.transformer import sequence_logprobs
    from rlax.core.trainer.batches import make_batch
    from rlax.core.types import Group

    tok = CharTokenizer("".join(chr(0x4E00 + i) for i in range(5000)))
    cfg = TransformerConfig(
        vocab_size=tok.vocab_size,
        num_layers=1,
        embed_dim=16,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=32,
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    s = JaxSampler(max_new_tokens=5, temperature=0.9)
    s.setup(model, tok)
    assert s._method(cfg.vocab_size) == "inverse_cdf"
    prompts = [
        Prompt(id=t, text=t, tokens=tok.encode(t, bos=True), answer="")
        for t in (chr(0x4E01) * 3, chr(0x4E99))
    ]
    out = s.generate(prompts, 3, seed=1)
    groups = [Group(p, cs, np.zeros(3, np.float32)) for p, cs in zip(prompts, out)]
    batch = make_batch(groups, np.zeros((2, 3)), completion_len=5)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 0.9)
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], batch.old_logprobs[mask], atol=1e-5)


def test_greedy_is_the_argmax_whatever_the_seed_with_the_tempered_logprob():
    # Row 0: token 2 is the most likely; row 1: a tie between 0 and 3 goes to the first.
    logits = jnp.array([[0.0, 1.0, 3.0, 2.0], [2.0, -1.0, 0.0, 2.0]])
    t = 0.5
    for seed in range(4):
        tok, logp, _ = sample_token(
            logits, jax.random.key(seed), jnp.float32(t), top_k=2, top_p=0.3, method="greedy"
        )
        assert np.asarray(tok).tolist() == [2, 0]
        # log softmax(logits / 0.5) at the chosen token, by hand: row 0 is [0, 2, 6, 4].
        row0 = 6 - np.log(np.exp(0) + np.exp(2) + np.exp(6) + np.exp(4))
        row1 = 4 - np.log(2 * np.exp(4) + np.exp(-2) + np.exp(0))
        np.testing.assert_allclose(np.asarray(logp), [row0, row1], rtol=1e-6)


def test_the_greedy_method_decodes_the_model_s_argmax_token_by_token(model):
    s = JaxSampler(max_new_tokens=5, method="greedy", stop_at_eos=False)
    s.setup(model, TOK)
    a = s.generate([prompt("3+4=")], 3, seed=0)[0]
    b = s.generate([prompt("3+4=")], 3, seed=7)[0]
    assert len({tuple(c.tokens) for c in a + b}) == 1
    # The model itself, one token at a time: each generated token is its argmax.
    tokens = list(TOK.encode("3+4=", bos=True))
    for generated in a[0].tokens:
        mask = jnp.ones((1, len(tokens)), bool)
        logits, _ = model(jnp.asarray([tokens]), positions_from_mask(mask), causal_mask(mask))
        assert int(generated) == int(jnp.argmax(logits[0, -1]))
        tokens.append(int(generated))


def test_a_temperature_of_zero_is_refused_pointing_at_the_greedy_method():
    with pytest.raises(ValueError) as info:
        JaxSampler(temperature=0.0)

    assert str(info.value) == (
        "jax sampler: temperature: must be > 0 (for greedy decoding set method='greedy'), got 0.0"
    )
