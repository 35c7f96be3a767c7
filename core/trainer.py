"""The trainer: one jitted policy-gradient step for any algorithm plugin.

The step recomputes the policy's logprobs with the training graph, hands them
to ``algorithm.loss`` (a pure function of arrays), applies the optax update and,
in the same compiled program, measures how far the update moved the policy on
the batch's own tokens (the k3 estimate of KL(old || new)). It never branches
on which algorithm it runs. Sharding over a device mesh arrives with the mesh
trainer; this single-device step is its unsharded special case.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.types import TrainBatch


class Algorithm(Protocol):
    needs_reference: bool
    needs_critic: bool

    def advantages(self, rewards: np.ndarray) -> np.ndarray: ...

    def loss(
        self, new_logprobs: jax.Array, batch: dict[str, jax.Array]
    ) -> tuple[jax.Array, dict]: ...


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def batch_arrays(batch: TrainBatch) -> dict[str, np.ndarray]:
    arrays = {k: v for k, v in dataclasses.asdict(batch).items() if v is not None}
    arrays.pop("group_ids")
    return arrays


@dataclasses.dataclass
class TrainState:
    params: nnx.State
    opt_state: Any
    step: int = 0


class Trainer:
    """Owns the policy parameters and optimiser state; ``step`` applies one update."""

    def __init__(
        self,
        model: Transformer,
        algorithm: Algorithm,
        optimizer: optax.GradientTransformation,
        *,
        temperature: float = 1.0,
    ):
        if algorithm.needs_critic:
            raise NotImplementedError(
                f"{type(algorithm).__name__} needs a critic; critics arrive with the algorithm suite"
            )
        self.graphdef, params = nnx.split(model)
        self.algorithm = algorithm
        self.optimizer = optimizer
        self.temperature = temperature
        self.state = TrainState(params=params, opt_state=optimizer.init(params))
        self._step = jax.jit(
            self._train_step, donate_argnums=(1,)
        )  # params stay readable by the sampler

    def _logprobs(self, params, batch):
        model = nnx.merge(self.graphdef, params)
        return sequence_logprobs(model, batch["tokens"], batch["attention_mask"], self.temperature)

    def _train_step(self, params, opt_state, batch):
        def loss_fn(p):
            logp, entropy = self._logprobs(p, batch)
            loss, metrics = self.algorithm.loss(logp, batch)
            return loss, (metrics, logp, entropy)

        (loss, (metrics, logp, entropy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        mask = batch["loss_mask"]
        new_logp, _ = self._logprobs(params, batch)
        # k3 estimator of KL(old || new) on tokens sampled from the old policy:
        # E_old[r - 1 - log r] with r = new / old (Schulman 2020, "Approximating KL").
        d = new_logp - logp
        metrics = dict(
            metrics,
            loss=loss,
            entropy=_masked_mean(entropy, mask),
            kl_old=_masked_mean(jnp.exp(d) - d - 1.0, mask),
            sampler_logprob_gap=_masked_mean(jnp.abs(logp - batch["old_logprobs"]), mask),
            grad_norm=optax.tree.norm(grads),
        )
        return params, opt_state, metrics

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser update on ``batch``; returns host-side float metrics."""
        arrays = batch_arrays(batch)
        params, opt_state, metrics = self._step(self.state.params, self.state.opt_state, arrays)
        self.state = TrainState(params, opt_state, self.state.step + 1)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def model(self) -> Transformer:
        """A live model view of the current parameters."""
        return nnx.merge(self.graphdef, self.state.params)
