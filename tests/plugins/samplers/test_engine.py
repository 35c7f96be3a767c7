"""The slot engine: the model's logprobs, every sample once, no recompiles, shared prompts,
rows continued after a cut, tokens across a weight update."""

import jax
import numpy as np
import pytest
from flax import nnx

from rlax.core.contracts import Resumable
from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer.batches import make_batch
from rlax.core.types import PARTIAL, Group, PartialGroup, Prompt
from rlax.plugins.samplers.engine import SlotEngine
from rlax.plugins.samplers.engine_host import make_ring
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
BUDGET = 20
# Two tiers whose small window (16 columns) rows outgrow: every long row is moved.
TIERS = ((3, 16), (2, 0))


def prompt(text):
    return Prompt(id=text, text=text, tokens=TOK.encode(text, bos=True), answer="")


PROMPTS = [prompt("7+5="), prompt("123+45="), prompt("1=")]  # different lengths


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def engine(model, **kw):
    settings = {
        "slots": 5,
        "chunk": 4,
        "max_new_tokens": BUDGET,
        "stop_at_eos": False,
        "max_prompt_tokens": 12,
        "tiers": TIERS,
    }
    e = SlotEngine(**{**settings, **kw})
    e.setup(model, TOK)
    return e


def tokens(groups):
    return [[c.tokens.tolist() for c in g] for g in groups]


def test_the_engine_is_resumable_and_the_static_sampler_is_not():
    assert isinstance(SlotEngine(), Resumable)
    assert not isinstance(JaxSampler(), Resumable)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_the_models_recomputed_logprobs(model, temperature):
    e = engine(model, temperature=temperature)
    out = e.generate(PROMPTS, 4, seed=3)  # 12 rows through 5 slots, long rows moved
    groups = [Group(p, cs, np.zeros(4, np.float32)) for p, cs in zip(PROMPTS, out)]
    batch = make_batch(groups, np.zeros((3, 4)), completion_len=BUDGET)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, temperature)
    mask = batch.loss_mask > 0
    assert mask.sum() == 12 * BUDGET
    np.testing.assert_allclose(np.asarray(logp)[mask], batch.old_logprobs[mask], atol=1e-5)


def test_greedy_rows_equal_the_static_samplers(model):
    static = JaxSampler(max_new_tokens=BUDGET, top_k=1, stop_at_eos=False)
    static.setup(model, TOK)
    want = static.generate(PROMPTS, 3, seed=0)
    got = engine(model, top_k=1).generate(PROMPTS, 3, seed=0)
    assert tokens(got) == tokens(want)
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_the_greedy_method_gives_the_static_samplers_argmax_rows(model):
    static = JaxSampler(max_new_tokens=BUDGET, method="greedy", stop_at_eos=False)
    static.setup(model, TOK)
    want = static.generate(PROMPTS, 2, seed=0)
    got = engine(model, method="greedy").generate(PROMPTS, 2, seed=5)
    assert tokens(got) == tokens(want)
    assert tokens(want) == tokens(engine(model, top_k=1).generate(PROMPTS, 2, seed=0))


def test_every_requested_sample_comes_back_once_in_its_place(model):
    # Distinct forced lengths name each sample: (prompt i, sample j) gets 1 + 3i + j tokens.
    budgets = [[1 + 3 * i + j for j in range(3)] for i in range(3)]
    budgets[2] = [BUDGET, 2, BUDGET]
    e = engine(model)
    out = e.generate_groups(PROMPTS, 3, seed=1, budgets=budgets)
    assert [[len(c.tokens) for c in g] for g in out] == budgets
    assert all(c.finish_reason == "length" for g in out for c in g)


def test_refilling_slots_never_recompiles_after_warm_up(model):
    e = engine(model)
    budgets = [[BUDGET, 3, 9, 14]] * 3
    e.generate_groups(PROMPTS, 4, seed=0, budgets=budgets)  # warm-up: every bucket seen
    warm = e.compiles
    others = [prompt("9+9="), prompt("52+13="), prompt("4=")]  # the same prompt buckets
    e.generate_groups(others, 4, seed=5, budgets=[[3, BUDGET, 14, 9]] * 3)
    e.load_weights(nnx.state(Transformer(CFG, rngs=nnx.Rngs(1))), 1)
    e.generate_groups(PROMPTS[::-1], 4, seed=6, budgets=budgets)
    assert e.compiles == warm


def test_shared_prompt_rows_equal_unshared_rows(model):
    shared = engine(model, top_k=1, share_prompts=True)
    unshared = engine(model, top_k=1, share_prompts=False)
    a, b = shared.generate(PROMPTS, 4, seed=0), unshared.generate(PROMPTS, 4, seed=0)
    assert tokens(a) == tokens(b)
    for ga, gb in zip(a, b):
        for x, y in zip(ga, gb):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    # One prefill per prompt against one per sample.
    prompt_tokens = sum(len(p.tokens) - 1 for p in PROMPTS)
    assert (shared.prefilled_tokens, unshared.prefilled_tokens) == (
        prompt_tokens,
        4 * prompt_tokens,
    )


def test_a_cut_row_continued_elsewhere_ends_with_the_uninterrupted_tokens(model):
    whole = engine(model, top_k=1).generate(PROMPTS, 3, seed=0)
    polls = []
    first = engine(model, top_k=1)
    cut = first.generate_groups(
        PROMPTS, 3, seed=0, interrupt=lambda: polls.append(1) or len(polls) >= 3
    )
    assert all(isinstance(g, PartialGroup) for g in cut)
    rows = [r for g in cut for r in g.rows]
    assert any(r.finish_reason == PARTIAL and len(r.tokens) for r in rows)
    assert any(r.finish_reason == PARTIAL and not len(r.tokens) for r in rows)  # never started
    done_before = sum(len(r.tokens) for r in rows)
    second = engine(model, top_k=1, slots=3, tiers=())  # another worker, other slots
    steps_before = second.step
    resumed = second.generate_groups(PROMPTS, 3, seed=9, partials=cut)
    assert tokens(resumed) == tokens(whole)
    for g, w in zip(resumed, whole):
        for a, b in zip(g, w):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    # Nothing generated twice: the second engine drew only the tokens the cut left.
    drawn = sum(len(c.tokens) for g in resumed for c in g) - done_before
    assert drawn == 9 * BUDGET - done_before and second.step > steps_before


def test_a_completion_across_a_weight_update_carries_both_versions(model):
    e = engine(model)
    newer = nnx.state(Transformer(CFG, rngs=nnx.Rngs(1)))
    polls = []

    def refresh():
        polls.append(1)
        return (newer, 7) if len(polls) == 1 else None

    out = e.generate_groups([PROMPTS[0]], 2, seed=0, refresh=refresh)
    for c in out[0]:
        assert c.versions is not None and set(c.versions.tolist()) == {0, 7}
        assert np.all(np.diff(c.versions) >= 0)  # old tokens first, then the new weights'
        assert (c.policy_version, c.newest_version) == (0, 7)  # judged by the oldest
    group = Group(PROMPTS[0], out[0], np.zeros(2, np.float32))
    assert group.policy_version == 0


def test_bad_settings_and_inputs_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="tiers .* must be"):
        make_ring(4, 64, ((3, 16), (2, 0)))  # 5 rows for 4 slots
    with pytest.raises(ValueError, match="tiers .* must be"):
        make_ring(4, 64, ((2, 32), (2, 16)))  # the last tier must read the whole ring
    with pytest.raises(ValueError, match="slots: must be >= 1, got 0"):
        SlotEngine(slots=0)
    e = SlotEngine(max_prompt_tokens=3, max_new_tokens=4)
    e.setup(Transformer(CFG, rngs=nnx.Rngs(0)), TOK)
    with pytest.raises(ValueError, match="prompt '123\\+45=' has 8 tokens; max_prompt_tokens is 3"):
        e.generate([prompt("123+45=")], 1, seed=0)


def test_default_tiers_split_the_slots_by_window():
    ring = make_ring(64, 1064)
    assert [w for _, _, w in ring.tiers] == [128, 256, 512, 1064]
    assert ring.tiers[-1][1] == 64 and [b - a for a, b, _ in ring.tiers] == [27, 17, 12, 8]
    assert make_ring(8, 100).tiers == ((0, 8, 100),)  # a short ring: one tier
    # Long prompts: no tier too small for them (16 rows of 512-token prompts in 528 columns).
    assert make_ring(16, 528, longest_prompt=512).tiers == ((0, 16, 528),)
    assert [w for *_, w in make_ring(16, 1064, longest_prompt=200).tiers] == [400, 1064]
    assert jax.numpy.array_equal(make_ring(3, 40, ((2, 16), (1, 0))).windows(), [16, 16, 40])
