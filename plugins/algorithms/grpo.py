"""GRPO: group-relative advantages with a clipped surrogate.

For a group of G completions of one prompt with rewards R_1..R_G:

.. math::

   A_i = \\frac{R_i - \\mathrm{mean}(R)}{\\mathrm{std}(R) + \\epsilon}
   \\qquad (\\mathrm{std}\\ \\text{with ddof} = 1,\\ \\epsilon = 10^{-6})

and every token t of completion i gets A_i. With the importance ratio
:math:`r_{i,t} = \\pi_\\theta(o_{i,t}) / \\pi_{old}(o_{i,t})` the per-token loss is

.. math::

   \\ell_{i,t} = -\\min\\big(r_{i,t} A_i,\\ \\mathrm{clip}(r_{i,t}, 1-\\varepsilon, 1+\\varepsilon) A_i\\big)
                 + \\beta\\, \\mathrm{KL}_{k3}(\\pi_\\theta \\| \\pi_{ref})

with :math:`\\mathrm{KL}_{k3} = e^{ref - new} - (ref - new) - 1`, aggregated over
tokens and sequences by one of ``token-mean``, ``seq-mean-token-mean`` (the
paper's) or ``seq-mean-token-sum-norm``.

References:
  Shao et al., 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300
  Schulman et al., 2017, PPO, https://arxiv.org/abs/1707.06347 (the clipped surrogate)
  Schulman, 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html (k3)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlax.core import hookimpl

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def group_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """(R - mean) / (std_ddof1 + eps) within each group. rewards: [N, G] -> [N, G].

    A group of one has std 0 by convention (its advantage is 0).
    """
    rewards = np.asarray(rewards, np.float64)
    mean = rewards.mean(axis=-1, keepdims=True)
    g = rewards.shape[-1]
    std = rewards.std(axis=-1, ddof=1, keepdims=True) if g > 1 else np.zeros_like(mean)
    return ((rewards - mean) / (std + eps)).astype(np.float32)


def clipped_surrogate(
    logratio: jax.Array, advantages: jax.Array, eps_low: float, eps_high: float
) -> tuple[jax.Array, jax.Array]:
    """Per-token -min(r A, clip(r, 1-eps_low, 1+eps_high) A) and whether it clipped."""
    ratio = jnp.exp(logratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    return -jnp.minimum(unclipped, clipped), clipped < unclipped


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str, max_len: int | None = None):
    """Reduces a [B, T] per-token value over the mask to a scalar.

    ``token-mean``: sum / number of tokens in the batch.
    ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
    ``seq-mean-token-sum-norm``: mean over sequences of token sum / max_len
    (``max_len`` defaults to T).
    """
    if mode == "token-mean":
        return jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    seq_tokens = jnp.sum(mask, axis=-1)
    has_tokens = (seq_tokens > 0).astype(per_token.dtype)
    n_seq = jnp.maximum(jnp.sum(has_tokens), 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(seq_tokens, 1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = jnp.sum(per_token * mask, axis=-1) / (max_len or per_token.shape[-1])
    else:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")
    return jnp.sum(per_seq * has_tokens) / n_seq


@dataclasses.dataclass(frozen=True)
class GRPO:
    """Group Relative Policy Optimization (arXiv 2402.03300).

    Args:
      clip_eps: ε of the clipped surrogate.
      kl_beta: weight of the k3 KL to a frozen reference policy (0 = none).
      aggregation: how per-token losses become one number (see :func:`aggregate`).
      std_eps: ε added to the group std.
    """

    clip_eps: float = 0.2
    kl_beta: float = 0.0
    aggregation: str = "seq-mean-token-mean"
    std_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"grpo: unknown aggregation {self.aggregation!r}; valid: {', '.join(AGGREGATIONS)}"
            )
        if not 0 < self.clip_eps < 1 or self.kl_beta < 0:
            raise ValueError(f"grpo: need 0 < clip_eps < 1 and kl_beta >= 0, got {self}")

    @property
    def needs_reference(self) -> bool:
        return self.kl_beta > 0

    needs_critic = False

    def advantages(self, rewards: np.ndarray) -> np.ndarray:
        """Sequence advantages [N, G] from rewards [N, G]; every token gets its row's value."""
        return group_advantages(rewards, self.std_eps)

    def loss(self, new_logprobs: jax.Array, batch: dict[str, jax.Array]):
        """Scalar loss and metrics. ``batch`` holds the [B, T-1] arrays of a TrainBatch."""
        mask = batch["loss_mask"]
        per_token, clipped = clipped_surrogate(
            new_logprobs - batch["old_logprobs"], batch["advantages"], self.clip_eps, self.clip_eps
        )
        metrics = {"clip_fraction": aggregate(clipped.astype(jnp.float32), mask, "token-mean")}
        if self.needs_reference:
            kl = k3_kl(new_logprobs, batch["ref_logprobs"])
            per_token = per_token + self.kl_beta * kl
            metrics["kl_ref"] = aggregate(kl, mask, "token-mean")
        return aggregate(per_token, mask, self.aggregation), metrics


@hookimpl
def rlax_register_algorithms():
    return {"grpo": GRPO}
