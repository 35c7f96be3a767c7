"""An algorithm as a composition of pure pieces: the RLAX unified objective.

Every algorithm of the suite is one :class:`PolicyGradient` value, built by a
short factory (``grpo()``, ``dapo()``, ``ppo()``, ...) from the pieces in this
package. Its loss is

.. math::

   L(\\theta) = \\mathrm{Agg}_{i,t}\\Big[\\, w_{i,t}\\,\\big(\\ell_{i,t}(\\theta; A_{i,t})
               + \\beta\\,\\mathrm{KL}_{i,t}(\\theta)\\big)\\Big] + c_V L_V(\\theta)

- :math:`\\mathrm{Agg}`, the aggregation weight: :mod:`.aggregation`;
- :math:`w`, the importance weight of train/inference alignment: :mod:`.alignment`;
- :math:`\\ell(\\theta; A)`, advantage × gradient term: :mod:`.objectives`, with
  :math:`A` from a sequence-level estimator (:mod:`.advantages`, on the host)
  and optionally token-level returns (:mod:`.returns`, in the step);
- the extra terms: a KL (k1, k2, k3 or the off-policy k3-is) to a frozen
  reference, a critic's value loss (:mod:`.value`) and an entropy bonus
  (:mod:`.entropy`);
- off-policy sequence masking (:mod:`.sequence_mask`): negative-advantage
  sequences that drifted too far from the current policy leave the loss;
- on-policy distillation (:mod:`.distillation`): a teacher's per-token logprobs
  (the batch's ``teacher_logprobs``) added to the advantages.

The trainer calls ``loss(new_logprobs, batch)`` with the batch's arrays plus
``train_logprobs`` (its own logprobs at the start of the step, no gradient)
and, for an algorithm with a critic, ``values`` (with gradient) and
``old_values`` (no gradient); ``ref_logprobs`` (the frozen starting policy's)
when ``needs_reference``; ``teacher_logprobs`` when ``needs_teacher``.

References:
  Zhou et al., 2025, RLAX, https://arxiv.org/abs/2512.06392 (the unified objective)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np

from rlax.core.contracts import Critic
from rlax.plugins.algorithms.aggregation import Aggregation, masked_mean
from rlax.plugins.algorithms.alignment import Alignment
from rlax.plugins.algorithms.distillation import Distillation
from rlax.plugins.algorithms.entropy import EntropyBonus
from rlax.plugins.algorithms.objectives import KL_ESTIMATORS, kl_estimate
from rlax.plugins.algorithms.returns import Returns
from rlax.plugins.algorithms.sequence_mask import OffPolicySequenceMask
from rlax.plugins.algorithms.value import ValueLoss

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax

Batch: TypeAlias = "dict[str, jax.Array]"


class Objective(Protocol):
    """A per-token policy loss: (logp, old_logp, advantages, mask) -> (loss [B, L], metrics)."""

    def __call__(
        self, logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]: ...


@dataclasses.dataclass(frozen=True)
class PolicyGradient:
    """A policy-gradient algorithm: the unified objective over the given pieces.

    Args:
      name: the algorithm's name, for messages.
      estimator: rewards [M, G] -> sequence advantages [M, G] (host, numpy).
      objective: the per-token policy loss.
      aggregation: how per-token values become the scalar loss.
      alignment: the importance weight against the sampler's logprobs.
      returns: token-level advantages computed in the step (PPO, REINFORCE++);
        None uses the sequence advantages as they are.
      kl_beta: β of the KL(π_θ ‖ π_ref) term in the loss (0 = none).
      kl_estimator: its per-token estimator, ``k1``, ``k2`` or ``k3``
        (:func:`~rlax.plugins.algorithms.objectives.kl_estimate`).
      critic: the value loss of a critic (PPO); needs ``returns``.
      distill: on-policy distillation: a teacher's per-token logprobs shape
        the advantages (:class:`~rlax.plugins.algorithms.distillation.Distillation`).
      sequence_mask: off-policy sequence masking
        (:class:`~rlax.plugins.algorithms.sequence_mask.OffPolicySequenceMask`).
      entropy: an entropy bonus (:class:`~rlax.plugins.algorithms.entropy.EntropyBonus`).
    """

    name: str
    estimator: Callable[[np.ndarray], np.ndarray]
    objective: Objective
    aggregation: Aggregation
    alignment: Alignment = dataclasses.field(default_factory=Alignment)
    returns: Returns | None = None
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    critic: ValueLoss | None = None
    distill: Distillation | None = None
    sequence_mask: OffPolicySequenceMask | None = None
    entropy: EntropyBonus | None = None

    def __post_init__(self) -> None:
        if self.kl_beta < 0:
            raise ValueError(f"{self.name}: kl_beta must be >= 0, got {self.kl_beta}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"{self.name}: unknown kl_estimator {self.kl_estimator!r}; "
                f"valid: {', '.join(KL_ESTIMATORS)}"
            )
        if self.critic is not None and self.returns is None:
            raise ValueError(f"{self.name}: a critic needs token-level returns (GAE)")

    @property
    def needs_reference(self) -> bool:
        return self.kl_beta > 0 or (self.returns is not None and self.returns.needs_reference)

    @property
    def needs_teacher(self) -> bool:
        """True: the batch brings a teacher's ``teacher_logprobs`` (``rlax.train.teacher``)."""
        return self.distill is not None

    @property
    def needs_entropy(self) -> bool:
        """True: the loss's batch brings the policy's ``entropy`` with gradient (a bonus)."""
        return self.entropy is not None and self.entropy.coef > 0

    @property
    def needs_critic(self) -> bool:
        return self.critic is not None

    @property
    def value_model(self) -> Critic:
        """The critic the trainer builds (only with a critic)."""
        if self.critic is None:
            raise AttributeError(f"{self.name} has no critic")
        return self.critic.model

    def advantages(self, rewards: np.ndarray) -> np.ndarray:
        """Sequence advantages [M, G] from rewards [M, G]; every token gets its row's value."""
        return np.asarray(self.estimator(rewards), np.float32)

    def batch_terms(self, batch: Batch) -> dict[str, jax.Array]:
        """The token-level returns of the whole rollout batch (``BatchTerms``; none without).

        With several updates per batch the trainer computes them once, from the
        batch's fixed anchors, so whitening runs over every token of the batch
        as it does with one update (verl and OpenRLHF compute advantages before
        splitting into minibatches); :meth:`loss` then uses each minibatch's rows.
        """
        if self.returns is None:
            return {}
        _, _, mask, _ = self.alignment(batch)
        old_values = batch["old_values"] if self.critic is not None else None
        advantages, returns, _ = self.returns(batch, mask, old_values)
        return {"batch_advantages": advantages, "batch_returns": returns}

    def loss(self, new_logprobs: jax.Array, batch: Batch) -> tuple[jax.Array, dict]:
        """The scalar loss and its metrics; ``batch`` holds [B, L] arrays (see module doc)."""
        old_logp, weight, mask, metrics = self.alignment(batch)
        if self.returns is None:
            advantages, returns = batch["advantages"], None
        elif "batch_advantages" in batch:  # a minibatch: the whole batch's (batch_terms)
            advantages, returns = batch["batch_advantages"], batch["batch_returns"]
            metrics.update(self.returns.metrics(batch, mask))
        else:
            old_values = batch["old_values"] if self.critic is not None else None
            advantages, returns, extra = self.returns(batch, mask, old_values)
            metrics.update(extra)
        if self.distill is not None:
            advantages, extra = self.distill(advantages, batch, mask)
            metrics.update(extra)
        if self.sequence_mask is not None:
            mask, extra = self.sequence_mask(new_logprobs, batch["old_logprobs"], advantages, mask)
            metrics.update(extra)
        per_token, extra = self.objective(new_logprobs, old_logp, advantages, mask)
        metrics.update(extra)
        if self.kl_beta > 0:
            kl = kl_estimate(
                new_logprobs, batch["ref_logprobs"], self.kl_estimator, batch["old_logprobs"]
            )
            per_token = per_token + self.kl_beta * kl
            metrics["kl_ref"] = masked_mean(kl, mask)
        loss = self.aggregation(weight * per_token, mask, batch["loss_mask"])
        if self.critic is not None:
            assert returns is not None  # guaranteed by __post_init__
            value_loss, extra = self.critic(batch["values"], batch["old_values"], returns, mask)
            metrics.update(extra)
            loss = loss + value_loss
        if self.needs_entropy:
            assert self.entropy is not None  # needs_entropy says so
            term, extra = self.entropy(batch["entropy"], self.aggregation, batch["loss_mask"])
            metrics.update(extra)
            loss = loss + term
        return loss, metrics


@contextlib.contextmanager
def settings_of(name: str) -> Iterator[None]:
    """Prefixes a ValueError raised while building an algorithm's pieces with its name."""
    try:
        yield
    except ValueError as err:
        if str(err).startswith(f"{name}:"):
            raise
        raise ValueError(f"{name}: {err}") from err


def off_policy_mask(delta: float | None) -> OffPolicySequenceMask | None:
    """The off-policy sequence mask of an algorithm's ``off_policy_delta`` (None: off)."""
    return None if delta is None else OffPolicySequenceMask(delta)


def alignment_of(mode: str, cap: float, bounds: tuple[float, float]) -> Alignment:
    """The :class:`Alignment` of an algorithm's ``alignment``/``is_cap``/``is_bounds`` settings."""
    low, high = bounds  # gin may hand over a list
    return Alignment(mode=mode, cap=cap, bounds=(low, high))
