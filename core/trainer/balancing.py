"""A mixture-of-experts policy's load balancing in the train step.

Two mechanisms, both options of the model (:class:`~rlax.core.models.config.MoeConfig`):

- the Switch/Mixtral **load-balancing loss** (``aux_loss_coef`` > 0): the step's
  loss is the algorithm's plus ``aux_loss_coef`` x E * sum_e f_e * P_e over the
  batch's real tokens, mean over the sparse layers (reported as
  ``moe_aux_loss``), its gradient added to the algorithm's;
- DeepSeek-V3's **balancing bias** (``router_bias``): after each update every
  sparse layer's bias moves by ``TrainerSettings.balance_bias_rate`` toward
  balance, b_e += rate * sign(mean load - load_e), the load counted over the
  update's tokens; the bias is not a gradient parameter.

Both read the batch routed as the step routes it (by the replayed experts
under routing replay) in one more forward pass over the step's layout (and a
backward through the routers' inputs with the loss on). That pass runs the
whole batch at once, not by microbatches.

References:
  Fedus et al., 2021, https://arxiv.org/abs/2101.03961 (Switch: the balancing loss)
  DeepSeek-AI, 2024, https://arxiv.org/abs/2412.19437 (V3: auxiliary-loss-free balancing)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax

from rlax.core.models import lora as loralib
from rlax.core.models import moe as moelib
from rlax.core.models.transformer import causal_mask, positions_from_mask
from rlax.core.trainer.microbatch import cast_floats

if TYPE_CHECKING:
    from rlax.core.trainer.step import Trainer


def terms(trainer: Trainer, params: Any, critic: Any, batch: dict[str, jax.Array]):
    """A mixture-of-experts policy's balancing terms of the batch's tokens, routed as the
    step routes them: (load-balancing loss, its gradient over the trainable parameters
    or None without ``aux_loss_coef``, each sparse layer's expert load [R, E]). One more
    forward pass (and backward through the routers' inputs with the loss on)."""
    cfg = trainer._model_cfg.moe
    assert cfg is not None
    inputs = trainer.passes.inputs(batch)
    tokens, mask = inputs["tokens"], inputs["attention_mask"]
    routes = inputs.get("routes") if trainer.settings.routing_replay != "off" else None

    def terms(trainable):
        p = trainable if critic is None else trainable[0]
        p = cast_floats(loralib.joined(params, p), trainer._compute_dtype)
        model = trainer._wrap_blocks(loralib.model_of(trainer.graphdef, p, inputs.get("token_ids")))
        _, _, routed = model.routed_hidden_states(
            tokens, positions_from_mask(mask), causal_mask(mask), replay=routes
        )
        return moelib.balancing_terms(routed, cfg.num_experts, mask != 0)

    trainable = trainer._trainable(params, critic)
    if cfg.aux_loss_coef > 0:
        (aux, load), grads = jax.value_and_grad(terms, has_aux=True)(trainable)
        return aux, grads, load
    aux, load = jax.lax.stop_gradient(terms(trainable))
    return aux, None, load


def balanced_bias(trainer: Trainer, old_params: Any, params: Any, load: jax.Array) -> Any:
    """``params`` with each sparse layer's router bias the one of ``old_params`` (before
    the update: it is not a gradient parameter, whatever the optimiser did to it) moved
    toward balance by ``load`` [R, E] (:func:`rlax.core.models.moe.balance_bias`)."""
    rate, layers = trainer.settings.balance_bias_rate, trainer._model_cfg.moe_layers

    def moved(path, new, old):
        keys = [getattr(k, "key", None) for k in path]
        if len(keys) > 3 and keys[0] == "blocks" and keys[2:4] == ["mlp", "router_bias"]:
            bias = moelib.balance_bias(old, load[layers.index(keys[1])], rate)
            return bias.astype(new.dtype)
        return new

    return jax.tree_util.tree_map_with_path(moved, params, old_params)
