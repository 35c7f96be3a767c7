"""The JAX sampler: jitted prefill + decode against a KV cache.

Prompts are left-padded to a bucketed length and the batch to a bucketed row
count, so steady-state sampling never recompiles. Decoding runs inside one
``lax.while_loop`` that stops as soon as every row has produced a stop token.
Each generated token comes with its log-probability under the sampling
distribution (softmax of logits / temperature), which the trainer compares
with its own recomputation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlax.core import hookimpl
from rlax.core.models.tokenizer import PAD
from rlax.core.models.transformer import Transformer, init_cache, positions_from_mask
from rlax.core.types import Completion, Prompt


def _bucket(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def _row_bucket(n: int) -> int:
    """Next power of two >= n (at least 8): few distinct batch shapes."""
    return max(8, 1 << (n - 1).bit_length())


def _generate(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    tokens: jax.Array,  # [B, P] left-padded
    mask: jax.Array,  # [B, P] bool
    key: jax.Array,
    temperature: jax.Array,  # scalar
    *,
    max_new_tokens: int,
    stop_id: int,
    top_k: int,
) -> tuple[jax.Array, jax.Array]:
    """Returns generated tokens [B, C] (PAD after the stop token) and their logprobs [B, C]."""
    model: Transformer = nnx.merge(graphdef, state)
    b, p = tokens.shape
    s = p + max_new_tokens
    slots = jnp.arange(s)
    key_valid = jnp.zeros((b, s), bool).at[:, :p].set(mask)
    prefill_mask = (slots[None, :] <= jnp.arange(p)[:, None])[None] & key_valid[:, None, :]
    positions = positions_from_mask(mask)
    logits, cache = model(tokens, positions, prefill_mask, init_cache(model.cfg, b, s), 0)

    def pick(logits, key):
        scaled = logits / temperature
        if top_k:
            kth = jax.lax.top_k(scaled, top_k)[0][:, -1:]
            scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
        tok = jax.random.categorical(key, scaled, axis=-1)
        logp = jax.nn.log_softmax(logits / temperature, axis=-1)
        return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]

    def cond(carry):
        i, done = carry[0], carry[1]
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        i, done, last_logits, pos, cache, key_valid, out_tok, out_logp, key = carry
        key, sub = jax.random.split(key)
        tok, logp = pick(last_logits, sub)
        tok = jnp.where(done, PAD, tok)
        out_tok = out_tok.at[:, i].set(tok)
        out_logp = out_logp.at[:, i].set(jnp.where(done, 0.0, logp))
        key_valid = key_valid.at[:, p + i].set(~done)
        step_mask = ((slots <= p + i)[None, :] & key_valid)[:, None, :]
        logits, cache = model(tok[:, None], pos[:, None], step_mask, cache, p + i)
        done = done | (tok == stop_id)
        return i + 1, done, logits[:, 0], pos + 1, cache, key_valid, out_tok, out_logp, key

    carry = (
        jnp.int32(0),
        jnp.zeros((b,), bool),
        logits[:, -1],
        positions[:, -1] + 1,
        cache,
        key_valid,
        jnp.full((b, max_new_tokens), PAD, jnp.int32),
        jnp.zeros((b, max_new_tokens), jnp.float32),
        key,
    )
    carry = jax.lax.while_loop(cond, body, carry)
    return carry[6], carry[7]


class JaxSampler:
    """KV-cache sampler for :class:`rlax.core.models.transformer.Transformer`.

    Args:
      max_new_tokens: generation budget per completion.
      temperature: softmax temperature (logprobs are of the tempered distribution).
      top_k: keep only the k most likely tokens (0 = off). Logprobs stay those of
        the full tempered distribution, which the trainer also computes.
      prompt_bucket: prompts are left-padded to a multiple of this length.
    """

    def __init__(
        self,
        *,
        max_new_tokens: int = 8,
        temperature: float = 1.0,
        top_k: int = 0,
        prompt_bucket: int = 8,
    ):
        if max_new_tokens < 1 or temperature <= 0 or top_k < 0 or prompt_bucket < 1:
            raise ValueError(
                "jax sampler: need max_new_tokens >= 1, temperature > 0, top_k >= 0, "
                f"prompt_bucket >= 1; got {max_new_tokens}, {temperature}, {top_k}, {prompt_bucket}"
            )
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.prompt_bucket = prompt_bucket
        self._fn = None
        self._state = None
        self.version = -1

    def setup(self, model: Transformer, tokenizer) -> None:
        """Binds the model architecture and tokenizer; weights come via load_weights."""
        graphdef, state = nnx.split(model)
        self.tokenizer = tokenizer
        self._fn = jax.jit(
            functools.partial(
                _generate,
                graphdef,
                max_new_tokens=self.max_new_tokens,
                stop_id=tokenizer.eos_id,
                top_k=self.top_k,
            )
        )
        self.load_weights(state, 0)

    def load_weights(self, state: nnx.State, version: int) -> None:
        self._state = state
        self.version = version

    def pad_prompts(self, prompts: Sequence[Prompt], n: int) -> tuple[np.ndarray, np.ndarray]:
        """Each prompt repeated n times, left-padded: tokens and mask, [rows, P]."""
        rows = len(prompts) * n
        b = _row_bucket(rows)
        p = _bucket(max(len(x.tokens) for x in prompts), self.prompt_bucket)
        tokens = np.full((b, p), PAD, np.int32)
        mask = np.zeros((b, p), bool)
        for i, prompt in enumerate(prompts):
            length = len(prompt.tokens)
            tokens[i * n : (i + 1) * n, p - length :] = prompt.tokens
            mask[i * n : (i + 1) * n, p - length :] = True
        # Bucket filler rows: a one-token prompt, ignored on output.
        mask[rows:, -1] = True
        return tokens, mask

    def generate(
        self, prompts: Sequence[Prompt], n: int, *, seed: int
    ) -> list[tuple[Completion, ...]]:
        """Samples ``n`` completions for each prompt; one tuple per prompt."""
        if self._fn is None:
            raise RuntimeError("jax sampler: setup(model, tokenizer) must be called first")
        tokens, mask = self.pad_prompts(prompts, n)
        out_tok, out_logp = self._fn(
            self._state, tokens, mask, jax.random.key(seed), jnp.float32(self.temperature)
        )
        out_tok, out_logp = np.asarray(out_tok), np.asarray(out_logp)
        return [
            tuple(self._completion(out_tok[i * n + j], out_logp[i * n + j]) for j in range(n))
            for i in range(len(prompts))
        ]

    def _completion(self, toks: np.ndarray, logps: np.ndarray) -> Completion:
        stops = np.flatnonzero(toks == self.tokenizer.eos_id)
        length = int(stops[0]) + 1 if len(stops) else len(toks)
        return Completion(
            tokens=toks[:length].copy(),
            logprobs=logps[:length].copy(),
            text=self.tokenizer.decode(toks[:length]),
            finish_reason="stop" if len(stops) else "length",
            policy_version=self.version,
        )


@hookimpl
def rlax_register_samplers():
    return {"jax": JaxSampler}
