"""The trainer: one jitted policy-gradient step for any algorithm plugin.

The step recomputes the policy's logprobs with the training graph, hands them
to ``algorithm.loss`` (a pure function of arrays), applies the optax update and,
in the same compiled program, measures how far the update moved the policy on
the batch's own tokens (the k3 estimate of KL(old || new)). It never branches
on which algorithm it runs, only on the algorithm's declared needs:

- every algorithm's ``loss`` receives the batch's arrays plus
  ``train_logprobs``: the training graph's logprobs at the start of the step,
  without gradient (what train/inference alignment compares with the
  sampler's ``old_logprobs``);
- ``needs_reference``: the trainer keeps the initial policy frozen and adds
  its logprobs as ``ref_logprobs`` (unless the batch brings its own);
- ``needs_critic``: the trainer builds the critic named by
  ``algorithm.value_model`` (:mod:`rlax.core.critic`), trains it with the same
  optimiser on the same loss, and adds ``values`` (with gradient) and
  ``old_values`` (without).

The train/inference mismatch between the sampler's and the trainer's
logprobs is always measured (``mismatch_abs_logp``, ``mismatch_kl``).
Sharding over a device mesh arrives with the mesh trainer; this
single-device step is its unsharded special case.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlax.core.critic import build_critic, forward_with_values
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.types import TrainBatch


class Algorithm(Protocol):
    """What the trainer needs of an algorithm plugin.

    An algorithm with ``needs_critic`` also names its critic's architecture
    in ``value_model`` (``"head"`` or ``"separate"``).
    """

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
    """Everything the optimiser changes.

    Attributes:
      params: the policy's parameters (what the sampler loads).
      opt_state: the optimiser's state over ``params`` (over ``(params,
        critic)`` for an algorithm with a critic).
      step: the number of updates applied.
      critic: the critic's parameters, or None.
    """

    params: nnx.State
    opt_state: Any
    step: int = 0
    critic: nnx.State | None = None


def _mismatch_metrics(train_logp: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """How far the sampler's logprobs are from the trainer's, on the sampled tokens.

    ``mismatch_kl`` is the k3 estimate of KL(π_sampler ‖ π_train): with
    d = log π_train − log π_sampler, E_sampler[e^d − 1 − d] (Schulman 2020).
    """
    mask = batch["loss_mask"]
    d = train_logp - batch["old_logprobs"]
    return {
        "mismatch_abs_logp": _masked_mean(jnp.abs(d), mask),
        "mismatch_kl": _masked_mean(jnp.exp(d) - 1.0 - d, mask),
    }


class Trainer:
    """Owns the policy (and critic) parameters and optimiser state; ``step`` applies one update."""

    def __init__(
        self,
        model: Transformer,
        algorithm: Algorithm,
        optimizer: optax.GradientTransformation,
        *,
        temperature: float = 1.0,
    ):
        self.graphdef, params = nnx.split(model)
        self.algorithm = algorithm
        self.optimizer = optimizer
        self.temperature = temperature
        critic = None
        self.critic_graphdef = None
        if algorithm.needs_critic:
            self.critic_graphdef, critic = nnx.split(build_critic(model, algorithm.value_model))
        # The frozen reference is the starting policy; its arrays are never donated.
        self.ref_params = params if algorithm.needs_reference else None
        opt_state = optimizer.init(self._trainable(params, critic))
        self.state = TrainState(params=params, opt_state=opt_state, critic=critic)
        # Only the optimiser state is donated: the sampler keeps reading params.
        self._step = jax.jit(self._train_step, donate_argnums=(2,))

    @staticmethod
    def _trainable(params, critic):
        return params if critic is None else (params, critic)

    def _forward(self, params, critic, batch):
        """(logprobs, entropy, values or None), each [B, T-1]."""
        model = nnx.merge(self.graphdef, params)
        if critic is None:
            logp, entropy = sequence_logprobs(
                model, batch["tokens"], batch["attention_mask"], self.temperature
            )
            return logp, entropy, None
        return forward_with_values(
            model,
            nnx.merge(self.critic_graphdef, critic),
            batch["tokens"],
            batch["attention_mask"],
            self.temperature,
        )

    def _train_step(self, params, critic, opt_state, ref_params, batch):
        if ref_params is not None and "ref_logprobs" not in batch:
            ref_logp, _, _ = self._forward(ref_params, None, batch)
            batch = dict(batch, ref_logprobs=jax.lax.stop_gradient(ref_logp))

        def loss_fn(trainable):
            p, c = (trainable, None) if critic is None else trainable
            logp, entropy, values = self._forward(p, c, batch)
            inputs = dict(batch, train_logprobs=jax.lax.stop_gradient(logp))
            if values is not None:
                inputs.update(values=values, old_values=jax.lax.stop_gradient(values))
            loss, metrics = self.algorithm.loss(logp, inputs)
            return loss, (metrics, logp, entropy)

        trainable = self._trainable(params, critic)
        (loss, (metrics, logp, entropy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable
        )
        updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        params, critic = (trainable, None) if critic is None else trainable
        mask = batch["loss_mask"]
        new_logp, _ = sequence_logprobs(
            nnx.merge(self.graphdef, params), batch["tokens"], batch["attention_mask"],
            self.temperature,
        )  # fmt: skip
        # k3 estimator of KL(old || new) on tokens sampled from the old policy:
        # E_old[r - 1 - log r] with r = new / old (Schulman 2020, "Approximating KL").
        d = new_logp - logp
        metrics = dict(
            metrics,
            **_mismatch_metrics(logp, batch),
            loss=loss,
            entropy=_masked_mean(entropy, mask),
            kl_old=_masked_mean(jnp.exp(d) - d - 1.0, mask),
            grad_norm=optax.tree.norm(grads),
        )
        return params, critic, opt_state, metrics

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser update on ``batch``; returns host-side float metrics."""
        arrays = batch_arrays(batch)
        s = self.state
        params, critic, opt_state, metrics = self._step(
            s.params, s.critic, s.opt_state, self.ref_params, arrays
        )
        self.state = TrainState(params, opt_state, s.step + 1, critic)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def model(self) -> Transformer:
        """A live model view of the current parameters."""
        return nnx.merge(self.graphdef, self.state.params)
