"""The sampler on a real model: SmolLM2 answers a chat question greedily, and the logprobs it
reports are the trainer's on the same tokens."""

from __future__ import annotations

import numpy as np

from rlax.core.models.transformer import sequence_logprobs
from rlax.core.trainer.batches import make_batch
from rlax.core.types import Group, Prompt
from rlax.plugins.samplers.jax_sampler import JaxSampler


def _prompt(tok, text):
    return Prompt(id=text, text=text, tokens=tok.encode(text, bos=True), answer="")


def test_greedy_chat_answer_and_logprobs_match_the_trainer(smollm2_bundle):
    tok, model = smollm2_bundle.tokenizer, smollm2_bundle.model
    # top_k=1 is greedy; recorded "full", the logprobs are those of softmax(logits / 0.8)
    # (recorded "truncated", each would be 0: the kept set is the one token).
    s = JaxSampler(
        max_new_tokens=12, temperature=0.8, top_k=1, prompt_bucket=16, recorded_logprobs="full"
    )
    s.setup(model, tok)
    prompts = [_prompt(tok, "What is 2+3?"), _prompt(tok, "Name a color.")]
    out = s.generate(prompts, 1, seed=0)
    answer = out[0][0].text
    assert "2 + 3 = 5" in answer, answer
    groups = [Group(p, cs, np.zeros(1, np.float32)) for p, cs in zip(prompts, out)]
    batch = make_batch(groups, np.zeros((2, 1)), completion_len=12)
    logp, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, 0.8)
    mask = batch.loss_mask > 0
    assert mask.sum() == sum(len(c.tokens) for cs in out for c in cs)
    diff = np.abs(np.asarray(logp)[mask] - batch.old_logprobs[mask])
    assert diff.max() < 2e-3, diff.max()  # fp32: prefill + cache vs one full pass
