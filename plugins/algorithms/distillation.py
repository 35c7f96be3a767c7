"""On-policy distillation: a teacher's per-token logprobs as a dense, per-token reward.

The student samples; the teacher scores every sampled token. The per-token
reverse KL :math:`\\mathrm{KL}(\\pi_\\theta \\| \\pi_T)` estimated on the student's
own samples (k1) is the negative of a reward, so the piece adds

.. math::

   A^{distill}_{i,t} = c\\,\\big(\\log\\pi_T(o_{i,t}) - \\log\\pi_{old}(o_{i,t})\\big)

to every token's advantage, where :math:`\\pi_{old}` is the trainer's policy
at the start of the step (``train_logprobs``, no gradient) and :math:`c` the
coefficient. The objective then takes its policy-gradient step as for any
advantage, so the gradient is the score-function gradient of the reverse KL
(:math:`-c\\,\\mathbb{E}[(\\log\\pi_T - \\log\\pi_{old})\\nabla\\log\\pi_\\theta]`),
with the ratio's clip and the alignment's weights on top. With the rewards'
advantages switched off (``reward_coef = 0`` in
:func:`rlax.plugins.algorithms.distill.distill`) it is pure
distillation; with both, the teacher's signal is a dense shaping of RL.

The teacher's logprobs reach the loss as the batch's ``teacher_logprobs``:
the trainer role computes them with the teacher model named in gin
(``rlax.train.teacher``, :mod:`rlax.core.trainer.teacher`). They are not the
reference's: a ``kl_beta`` KL term of the same algorithm keeps the frozen
starting policy as its target (``ref_logprobs``), so distillation pulls the
student towards the teacher while the KL term holds it near where it started.

References:
  Agarwal et al., 2024, "On-Policy Distillation of Language Models: Learning from
  Self-Generated Mistakes" (GKD), https://arxiv.org/abs/2306.13649
  Gu et al., 2024, "MiniLLM: Knowledge Distillation of Large Language Models",
  https://arxiv.org/abs/2306.08543 (reverse KL on the student's samples)
  Lu and Thinking Machines Lab, 2025, "On-Policy Distillation",
  https://thinkingmachines.ai/blog/on-policy-distillation/ (per-token reverse KL as the advantage)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlax.plugins.algorithms.aggregation import masked_mean

if TYPE_CHECKING:  # annotations only: the algorithm's settings are read where JAX is not
    import jax


@dataclasses.dataclass(frozen=True)
class Distillation:
    """Adds ``coef * (teacher - old)`` logprobs to each token's advantage (module doc).

    Args:
      coef: c, the weight of the teacher's signal (> 0).
    """

    coef: float = 1.0

    def __post_init__(self) -> None:
        if self.coef <= 0:
            raise ValueError(f"distillation: coef must be > 0, got {self.coef}")

    def __call__(
        self,
        advantages: jax.Array,  # [B, L]
        batch: dict[str, jax.Array],
        mask: jax.Array,  # [B, L]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(advantages + the teacher's term, metrics: the reverse KL's k1 and k3 estimates)."""
        import jax
        import jax.numpy as jnp

        gap = jax.lax.stop_gradient(
            batch["teacher_logprobs"] - batch["train_logprobs"]
        )  # log T - log old
        metrics = {
            "distill_reverse_kl": masked_mean(-gap, mask),
            "distill_reverse_kl_k3": masked_mean(jnp.exp(gap) - 1.0 - gap, mask),
        }
        return advantages + self.coef * gap * mask, metrics
