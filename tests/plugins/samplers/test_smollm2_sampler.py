"""The sampler on a real model: SmolLM2 answers a chat question greedily, and its logprobs
are the trainer's on the same tokens."""

from __future__ import annotations

import numpy as np

from rlax.core.batching import make_batch
from rlax.core.models.transformer import sequence_logprobs
from rlax.core.types import Group, Prompt
from rlax.plugins.samplers.jax_sampler import JaxSampler


def _prompt(tok, text):
    return Prompt(id=text, text=text, tokens=tok.encode(text, bos=True), answer="")


def test_greedy_chat_answer(smollm2_bundle):
    tok = smollm2_bundle.tokenizer
    s = JaxSampler(max_new_tokens=12, top_k=1, prompt_bucket=16)
    s.setup(smollm2_bundle.model, tok)
    (c,) = s.generate([_prompt(tok, "What is 2+3?")], 1, seed=0)[0]
    assert "5" in c.text, c.text
    assert "2 + 3 = 5" in c.text or c.finish_reason == "length", c.text


def test_sampler_logprobs_match_the_trainers(smollm2_bundle):
    tok, model = smollm2_bundle.tokenizer, smollm2_bundle.model
    s = JaxSampler(max_new_tokens=10, temperature=0.8, prompt_bucket=16)
    s.setup(model, tok)
    prompts = [_prompt(tok, "What is 7+8?"), _prompt(tok, "Name a color.")]
    out = s.generate(prompts, 2, seed=4)
    groups = [Group(p, cs, np.zeros(2, np.float32)) for p, cs in zip(prompts, out)]
    batch = make_batch(groups, np.zeros((2, 2)), completion_len=10)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 0.8)
    mask = batch.loss_mask > 0
    diff = np.abs(np.asarray(logp)[mask] - batch.old_logprobs[mask])
    assert mask.sum() == sum(len(c.tokens) for cs in out for c in cs)
    assert diff.max() < 2e-3, diff.max()  # fp32: prefill+cache vs one full pass
