"""The KV-cache sampler: its logprobs are the model's, stops are honoured, seeds reproduce."""

import numpy as np
import pytest
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer.batches import make_batch
from rlax.core.types import Group, Prompt
from rlax.plugins.samplers.jax_sampler import JaxSampler

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


@pytest.fixture(scope="module")
def sampler(model):
    s = JaxSampler(max_new_tokens=6, temperature=1.0)
    s.setup(model, TOK)
    return s


def recomputed(model, groups, max_new_tokens, temperature=1.0):
    """The model's own logprobs of the sampled tokens, from a full forward pass."""
    batch = make_batch(
        groups, np.zeros((len(groups), len(groups[0].completions))), completion_len=max_new_tokens
    )
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, temperature)
    return np.asarray(logp), batch


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_model_logprobs(model, temperature):
    s = JaxSampler(max_new_tokens=6, temperature=temperature)
    s.setup(model, TOK)
    prompts = [prompt("7+5="), prompt("123+45="), prompt("1=")]  # different lengths: left padding
    out = s.generate(prompts, 4, seed=3)
    groups = [Group(p, cs, np.zeros(4, np.float32)) for p, cs in zip(prompts, out)]
    logp, batch = recomputed(model, groups, 6, temperature)
    mask = batch.loss_mask > 0
    assert mask.sum() == sum(len(c.tokens) for cs in out for c in cs)
    np.testing.assert_allclose(logp[mask], batch.old_logprobs[mask], atol=1e-5)
    assert np.all(batch.old_logprobs[mask] < 0)


def test_completions_end_at_the_stop_token_or_the_budget(sampler):
    out = sampler.generate([prompt("1+1=")], 32, seed=0)[0]
    for c in out:
        assert len(c.tokens) == len(c.logprobs) <= 6
        stops = np.flatnonzero(c.tokens == TOK.eos_id)
        if c.finish_reason == "stop":
            assert list(stops) == [len(c.tokens) - 1]
        else:
            assert c.finish_reason == "length" and len(c.tokens) == 6 and len(stops) == 0
        assert c.text == TOK.decode(c.tokens)
        assert c.policy_version == sampler.version


def test_same_seed_same_samples_other_seed_differs(sampler):
    ps = [prompt("12+34="), prompt("5+6=")]
    a = sampler.generate(ps, 8, seed=11)
    b = sampler.generate(ps, 8, seed=11)
    c = sampler.generate(ps, 8, seed=12)
    flat = lambda out: [tuple(x.tokens) for cs in out for x in cs]
    assert flat(a) == flat(b)
    assert flat(a) != flat(c)


def test_load_weights_changes_the_policy_and_version(model):
    s = JaxSampler(max_new_tokens=4)
    s.setup(model, TOK)
    other = Transformer(CFG, rngs=nnx.Rngs(7))
    before = s.generate([prompt("9=")], 16, seed=0)[0]
    s.load_weights(nnx.state(other), version=3)
    after = s.generate([prompt("9=")], 16, seed=0)[0]
    assert all(c.policy_version == 3 for c in after)
    assert [tuple(c.logprobs) for c in before] != [tuple(c.logprobs) for c in after]


def test_invalid_settings_and_missing_setup():
    with pytest.raises(ValueError, match="temperature"):
        JaxSampler(temperature=0.0)
    with pytest.raises(RuntimeError, match="setup"):
        JaxSampler().generate([prompt("1=")], 1, seed=0)


def test_one_kv_cache_is_kept_reused_in_place_and_cleared_for_each_call(model):
    """The cache is the sampler's buffer, donated to each call and handed back: the same
    memory for calls of one shape, a new one for another shape, and nothing of a call's
    keys and values reaches the next (its samples equal a fresh sampler's)."""
    s = JaxSampler(max_new_tokens=6)
    s.setup(model, TOK)
    ps = [prompt("123+45="), prompt("6+7=")]
    s.generate(ps, 4, seed=1)
    address = s._cache[0]["k"].unsafe_buffer_pointer()
    after_other = s.generate([prompt("98+76="), prompt("5=")], 4, seed=2)  # same shapes
    assert s._cache[0]["k"].unsafe_buffer_pointer() == address
    fresh = JaxSampler(max_new_tokens=6)
    fresh.setup(model, TOK)
    want = fresh.generate([prompt("98+76="), prompt("5=")], 4, seed=2)
    assert [[tuple(c.tokens) for c in g] for g in after_other] == [
        [tuple(c.tokens) for c in g] for g in want
    ]
    s.generate([prompt(str(i) + "=") for i in range(5)], 4, seed=3)  # 20 rows: bucket 32
    assert s._cache[0]["k"].shape[0] == 32  # one cache, of the last shape


@pytest.mark.parametrize("n", [8, 3])
def test_each_prompt_is_prefilled_once_and_its_rows_equal_unshared_rows(model, n):
    """3 prompts x n samples: with 8 each (32 rows) the prompts are prefilled once, in 8
    rows (their bucket), and copied into their samples' rows; with 3 (16 rows) too; every
    row has the tokens of the same row given as 3n prompts of one sample (each
    prefilled), and its logprobs up to float rounding (the prefill's products over 8
    rows, not 32: 7e-7 apart here)."""
    s = JaxSampler(max_new_tokens=6, temperature=1.0, stop_at_eos=False)
    s.setup(model, TOK)
    prompts = [prompt("7+5="), prompt("123+45="), prompt("1=")]
    shared = s.generate(prompts, n, seed=5)
    assert s.prefilled_tokens == 8 * 8  # 8 prompt rows x 8 positions (the prompt bucket)
    each = [Prompt(f"{p.id}/{j}", p.text, p.tokens, "") for p in prompts for j in range(n)]
    alone = s.generate(each, 1, seed=5)
    assert s.prefilled_tokens == 8 * 8 + (32 if n == 8 else 16) * 8  # every row
    rows = [c for cs in shared for c in cs]
    assert len(rows) == len(alone) == 3 * n
    for a, (b,) in zip(rows, alone, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


def test_which_rows_are_prefilled_and_which_copied():
    """Rows past the last sample take a one-token filler prompt (ignored); prompts whose
    bucket is the rows' (up to 8 rows in all, or a prompt per row) are prefilled in
    place, one row each, so such batches stay one program whatever they hold."""
    s = JaxSampler(max_new_tokens=2)
    tokens, mask, rows_of = s.pad_prompts([prompt("7+5="), prompt("1="), prompt("12=")], 5)
    assert tokens.shape == (8, 8) and rows_of.shape == (16,)  # 15 rows in a bucket of 16
    assert rows_of.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3]
    assert mask[3].tolist() == [False] * 7 + [True]  # a filler prompt: one token
    tokens, mask, rows_of = s.pad_prompts([prompt("7+5=")], 16)
    assert tokens.shape == (8, 8) and rows_of.tolist() == [0] * 16
    for prompts, n in (([prompt("7+5=")], 8), ([prompt("1="), prompt("22=")], 3)):
        tokens, mask, rows_of = s.pad_prompts(prompts, n)  # 8 rows: in place
        assert tokens.shape == (8, 8) and rows_of.tolist() == list(range(8))
        assert (tokens[0] == tokens[n - 1]).all() and mask[len(prompts) * n :, :-1].sum() == 0
