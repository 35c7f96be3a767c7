"""Supervised fine-tuning on (prompt, target text) pairs.

Used to build a partially competent starting policy (the quickstart's base
model is made this way by ``scripts/build_quickstart_base.py``): next-token
cross-entropy on the target tokens only, the prompt is context.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from rlax.core.masked import masked_mean
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.trainer.batches import make_batch
from rlax.core.trainer.step import batch_arrays
from rlax.core.types import Completion, Group, Prompt


def target_group(prompt: Prompt, target: np.ndarray) -> Group:
    """A one-completion group whose completion is the target token ids."""
    comp = Completion(target, np.zeros(len(target), np.float32), "", "stop", 0)
    return Group(prompt, (comp,), np.zeros(1, np.float32))


def supervised_finetune(
    model: Transformer,
    examples: Iterator[tuple[Prompt, np.ndarray]],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    progress: bool = True,
) -> list[float]:
    """Trains ``model`` in place on (prompt, target ids) pairs; returns the loss curve."""
    graphdef, params = nnx.split(model)
    optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, learning_rate, 50, steps))
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            logp, _ = sequence_logprobs(
                nnx.merge(graphdef, p), batch["tokens"], batch["attention_mask"]
            )
            return -masked_mean(logp, batch["loss_mask"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in tqdm(range(steps), desc="sft", disable=not progress):
        groups = [target_group(*next(examples)) for _ in range(batch_size)]
        batch = make_batch(groups, np.zeros((batch_size, 1), np.float32))
        params, opt_state, loss = step(params, opt_state, batch_arrays(batch))
        losses.append(float(loss))
    nnx.update(model, params)
    return losses
