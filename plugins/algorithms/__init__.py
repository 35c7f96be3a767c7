"""The algorithms' public surface: building blocks and factories by name, as optax's.

A third-party algorithm imports names, not module paths::

    from rlax.plugins import algorithms as algos

    algo = algos.PolicyGradient(
        name="mine",
        estimator=algos.group_normalized,
        objective=algos.ClippedSurrogate(0.2, 0.28),
        aggregation=algos.Aggregation("token-mean"),
    )

The pieces, one module each (the unified objective is written out in
:mod:`.policy_gradient`):

- sequence-level advantage estimators, rewards [M, G] -> advantages [M, G]
  on the host: :mod:`.advantages`;
- aggregations, per-token values -> the scalar loss: :mod:`.aggregation`;
- train/inference alignment, the importance weight: :mod:`.alignment`;
- per-token objectives (policy losses, dual clip) and the KL estimators: :mod:`.objectives`;
- on-policy distillation's per-token teacher term: :mod:`.distillation`;
- off-policy sequence masking: :mod:`.sequence_mask`; the entropy bonus: :mod:`.entropy`;
- token-level returns computed in the step (GAE, whitening): :mod:`.returns`;
- the critic's value loss: :mod:`.value`;
- their composition, :class:`PolicyGradient`, and the helpers the factories
  share: :mod:`.policy_gradient`;
- one factory per shipped algorithm (``grpo`` ... ``ppo``), each registered
  by the plugin module of the same name.

Importing this package registers and loads nothing: the plugin manager
(:func:`rlax.core.plugins.build_plugin_manager`) registers each algorithm
module's ``rlax_register_algorithms`` when it loads that module's entry
point. The modules import each other by module path, never through this
package, so there is no import cycle.
"""

from __future__ import annotations

from rlax.plugins.algorithms.advantages import (
    group_centered,
    group_normalized,
    leave_one_out,
    raw_returns,
)
from rlax.plugins.algorithms.aggregation import (
    AGGREGATIONS,
    Aggregation,
    AggregationMode,
    MaxLen,
    aggregate,
    completion_width,
)
from rlax.plugins.algorithms.alignment import (
    ALIGNMENTS,
    Alignment,
    AlignmentMode,
    IsBounds,
    IsCap,
)
from rlax.plugins.algorithms.cispo import cispo
from rlax.plugins.algorithms.dapo import dapo
from rlax.plugins.algorithms.distill import distill
from rlax.plugins.algorithms.distillation import Distillation
from rlax.plugins.algorithms.drgrpo import drgrpo
from rlax.plugins.algorithms.entropy import EntropyBonus, EntropyCoef
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.algorithms.gspo import gspo
from rlax.plugins.algorithms.objectives import (
    KL_ESTIMATORS,
    ClipEps,
    ClippedISWeight,
    ClippedSurrogate,
    DualClip,
    EpsHigh,
    KlBeta,
    KlEstimator,
    SequenceClippedSurrogate,
    StdEps,
    clipped_surrogate,
    dual_clip_above_clip,
    k3_kl,
    kl_estimate,
)
from rlax.plugins.algorithms.policy_gradient import (
    Batch,
    Objective,
    PolicyGradient,
    alignment_of,
    settings_of,
)
from rlax.plugins.algorithms.ppo import ppo
from rlax.plugins.algorithms.reinforcepp import reinforcepp, reinforcepp_baseline
from rlax.plugins.algorithms.returns import Returns, gae, terminal_rewards, whiten
from rlax.plugins.algorithms.rloo import rloo
from rlax.plugins.algorithms.sequence_mask import OffPolicyDelta, OffPolicySequenceMask
from rlax.plugins.algorithms.value import ValueLoss

__all__ = [
    "AGGREGATIONS",
    "ALIGNMENTS",
    "KL_ESTIMATORS",
    "Aggregation",
    "AggregationMode",
    "Alignment",
    "AlignmentMode",
    "Batch",
    "ClipEps",
    "ClippedISWeight",
    "ClippedSurrogate",
    "Distillation",
    "DualClip",
    "EntropyBonus",
    "EntropyCoef",
    "EpsHigh",
    "IsBounds",
    "IsCap",
    "KlBeta",
    "KlEstimator",
    "MaxLen",
    "Objective",
    "OffPolicyDelta",
    "OffPolicySequenceMask",
    "PolicyGradient",
    "Returns",
    "SequenceClippedSurrogate",
    "StdEps",
    "ValueLoss",
    "aggregate",
    "alignment_of",
    "cispo",
    "clipped_surrogate",
    "completion_width",
    "dapo",
    "distill",
    "drgrpo",
    "dual_clip_above_clip",
    "gae",
    "group_centered",
    "group_normalized",
    "grpo",
    "gspo",
    "k3_kl",
    "kl_estimate",
    "leave_one_out",
    "ppo",
    "raw_returns",
    "reinforcepp",
    "reinforcepp_baseline",
    "rloo",
    "settings_of",
    "terminal_rewards",
    "whiten",
]
