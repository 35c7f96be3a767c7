"""The mesh trainer: one jitted policy-gradient step for any algorithm plugin.

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
  its logprobs as ``ref_logprobs`` (unless the batch brings them: several
  updates per batch fix them once, :mod:`rlax.core.trainer.epochs`);
- ``needs_critic``: the trainer builds the critic ``algorithm.value_model``
  gives (a :class:`~rlax.core.contracts.Critic`; :mod:`rlax.core.models.critic`),
  trains it with the same optimiser on the same loss, and adds ``values`` (with
  gradient) and ``old_values`` (without).

The train/inference mismatch between the sampler's and the trainer's
logprobs under the same weights is measured every step (``mismatch_abs_logp``,
``mismatch_kl``; :mod:`rlax.core.trainer.mismatch`).

Layout (:mod:`rlax.core.parallel.mesh`): parameters, critic and optimiser state live on
a (data, fsdp, tensor) mesh as the sharding rules say, the batch is split over
(data, fsdp) by rows, and the step is compiled with exactly those in/out
shardings; GSPMD inserts the collectives. Without a mesh the trainer uses a
one-device mesh, the unsharded special case.

Microbatches, remat and the activations' layout (:class:`TrainerSettings`) are
in :mod:`rlax.core.trainer.microbatch`: with microbatches the step runs the
chain rule in two passes, so the update is the one-batch update for any loss.
The batch's layout, padded or packed (``TrainerSettings.packing``), is chosen
on the host by :meth:`Trainer.layout`; :mod:`rlax.core.trainer.passes` runs
the passes for either, and the loss always sees the padded layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlax.core.contracts import Algorithm, Critic, UsesEntropy
from rlax.core.masked import masked_mean
from rlax.core.models import lora as loralib
from rlax.core.models.critic import forward_with_values
from rlax.core.models.routing_replay import replayed_logprobs
from rlax.core.models.transformer import Transformer, sequence_logprobs
from rlax.core.parallel import mesh as meshlib
from rlax.core.parallel import multihost
from rlax.core.runtime import executables
from rlax.core.trainer import balancing, memory, mismatch, packing, passes
from rlax.core.trainer.microbatch import ModuleT, cast_floats, wrap_blocks
from rlax.core.trainer.settings import COMPUTE_DTYPES, PLACEMENTS, TrainerSettings
from rlax.core.types import TrainBatch

__all__ = ["PLACEMENTS", "TrainState", "Trainer", "TrainerSettings", "batch_arrays"]


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


class Trainer:
    """Owns the policy (and critic) parameters and optimiser state; ``step`` applies one update.

    Args:
      model: the policy; its parameters become float32 master weights on ``mesh``.
      algorithm: the algorithm plugin (loss, needs).
      optimizer: any optax transformation (schedules and clipping included).
      temperature: the sampler's temperature (logprobs are of the tempered policy).
      mesh: a (data, fsdp, tensor) mesh (:func:`rlax.core.parallel.mesh.make_mesh`);
        None: one device.
      settings: microbatches, remat, compute dtype, placements.
      rules: the sharding rules (:data:`rlax.core.parallel.mesh.DEFAULT_RULES`).
      lora: train low-rank adapters on a frozen base instead (:mod:`rlax.core.models.lora`);
        ``state.params`` is then a :class:`~rlax.core.models.lora.LoraParams`.
      donate_params: the step reuses the parameters' memory for the new ones
        (one copy of the weights less at the step's peak), so ``state.params``
        of before a step is deleted by it: only for callers that hold no
        parameters across a step (a trainer that pushes its weights to the
        parameter server, not one whose sampler reads them in-process). The
        reference policy is then a copy. Ignored under ``lora`` (its params
        are mostly the frozen base, which the reference shares).
    """

    def __init__(
        self,
        model: Transformer,
        algorithm: Algorithm,
        optimizer: optax.GradientTransformation,
        *,
        temperature: float = 1.0,
        mesh: Mesh | None = None,
        settings: TrainerSettings | None = None,
        rules: tuple[meshlib.Rule, ...] = meshlib.DEFAULT_RULES,
        lora: loralib.LoraConfig | None = None,
        donate_params: bool = False,
    ):
        self.mesh = mesh or meshlib.single_device_mesh()
        self.settings = settings or TrainerSettings()
        if self.settings.attention_block and meshlib.context_size(self.mesh) > 1:
            raise ValueError(
                "rlax.trainer_settings.attention_block > 0 with a context mesh axis of "
                f"{meshlib.context_size(self.mesh)}: the split sequence's attention gathers keys "
                "and values whole; set attention_block = 0 or the context axis to 1"
            )
        moe = model.cfg.moe
        self._balances_bias = bool(moe and moe.router_bias and self.settings.balance_bias_rate)
        if self._balances_bias and lora is not None:
            raise ValueError(
                "rlax.trainer_settings.balance_bias_rate > 0 with LoRA: the router bias is in "
                "the frozen base; set it to 0"
            )
        self.rules = rules
        self.graphdef, params = nnx.split(model)
        self.algorithm = algorithm
        self.donate_params = donate_params and lora is None
        self.optimizer = optimizer
        self.temperature = temperature
        self._compute_dtype = COMPUTE_DTYPES[self.settings.compute_dtype]
        dropout = lora is not None and lora.dropout > 0
        self.passes = passes.Passes(self.settings, self.mesh, token_ids=dropout)
        self._embed_dim = model.cfg.embed_dim  # for packing's cost estimate
        self._model_cfg = model.cfg  # for the activation memory estimate
        params = cast_floats(params, jnp.float32)
        if lora is not None:  # from here on ``params`` is a LoraParams (base, adapters, key)
            params = loralib.attach(params, lora)  # type: ignore[assignment]
        critic = None
        self.critic_graphdef = None
        self.value_model: Critic | None = None  # the critic component, which computes values
        if algorithm.needs_critic:
            self.value_model = algorithm.value_model
            self.critic_graphdef, critic = nnx.split(self.value_model.build(model, nnx.Rngs(0)))
            critic = cast_floats(critic, jnp.float32)
        self.param_shardings = self._shardings(params, "sharded")
        self.critic_shardings = self._shardings(critic, self.settings.critic_placement)
        params = jax.device_put(params, self.param_shardings)
        critic = None if critic is None else jax.device_put(critic, self.critic_shardings)
        # The frozen reference is the starting policy; its arrays are never donated.
        self.ref_params = self.ref_shardings = None
        if algorithm.needs_reference:
            ref = loralib.reference(params)  # under LoRA: the base (B = 0), its arrays shared
            self.ref_shardings = self._shardings(ref, self.settings.reference_placement)
            self.ref_params = jax.device_put(
                ref, self.ref_shardings, may_alias=not self.donate_params
            )
        trainable = self._trainable(params, critic)
        self.opt_shardings = meshlib.tree_shardings(
            jax.eval_shape(optimizer.init, trainable), self.mesh, rules
        )
        opt_state = jax.jit(optimizer.init, out_shardings=self.opt_shardings)(trainable)
        self.state = TrainState(params=params, opt_state=opt_state, critic=critic)
        self._compiled: dict[tuple, Any] = {}
        # The previous version's weights, for the mismatch of rows sampled with them
        # (rlax.core.trainer.mismatch; kept by update_on_batch). None: not kept.
        self.previous_params: Any = None

    # -- layout ---------------------------------------------------------------

    def _shardings(self, tree: Any, placement: str) -> Any:
        if tree is None:
            return None
        if placement == "replicated":
            return jax.tree.map(lambda _: meshlib.replicated(self.mesh), tree)
        return meshlib.tree_shardings(tree, self.mesh, self.rules)

    def batch_shardings(self, arrays: dict[str, Any]) -> dict[str, NamedSharding]:
        return meshlib.batch_shardings(arrays, self.mesh)

    def _step_fn(self, arrays: dict[str, Any]):
        """The step compiled for this batch's keys and ranks, with explicit in/out shardings."""
        key = tuple(sorted((k, np.ndim(v)) for k, v in arrays.items()))
        if key not in self._compiled:
            repl = meshlib.replicated(self.mesh)
            jitted = jax.jit(
                self._train_step,
                in_shardings=(
                    self.param_shardings,
                    self.critic_shardings,
                    self.opt_shardings,
                    self.ref_shardings,
                    self.batch_shardings(arrays),
                ),
                out_shardings=(
                    self.param_shardings,
                    self.critic_shardings,
                    self.opt_shardings,
                    repl,
                ),
                # The optimiser state always; params unless someone reads them after the step.
                donate_argnums=(0, 2) if self.donate_params else (2,),
            )
            self._compiled[key] = executables.stored("train_step", jitted, self.closure())
            print(self.activation_estimate(arrays).describe(), flush=True)  # at start
        return self._compiled[key]

    def activation_estimate(self, arrays: dict[str, Any]) -> memory.ActivationEstimate:
        """The activation memory per device of a step on ``arrays`` (laid out), as
        :func:`rlax.core.trainer.memory.activation_bytes` estimates it."""
        packed = packing.PACKED_TOKENS in arrays
        rows, width = np.shape(arrays[packing.PACKED_TOKENS if packed else "tokens"])
        slices = self.passes._slots(arrays) if packed else self.settings.microbatches
        per_device = -(-rows // (slices * meshlib.batch_size_multiple(self.mesh)))
        return memory.activation_bytes(
            self._model_cfg,
            per_device,
            width,
            meshlib.context_size(self.mesh),
            self.settings.remat,
            self.settings.compute_dtype,
            self.settings.attention_block,
        )

    def closure(self) -> str:
        """What the compiled programs close over beyond their arguments, described for the
        store of compiled programs (:mod:`rlax.core.runtime.executables`)."""
        return executables.describe(
            (
                self.graphdef,
                self.critic_graphdef,
                self.settings,
                self.algorithm,
                self.optimizer,  # functions: its constants are in the gin configuration
                self.rules,
                self.temperature,
                self._compute_dtype,
                self.donate_params,
                self.mesh,
            )
        )

    def prefetch_programs(self) -> int:
        """Starts reading this trainer's stored compiled programs (every batch variant an
        earlier process met) in the background; how many (0 with the store off)."""
        closure = self.closure()
        return sum(
            executables.prefetch(n, closure)
            for n in ("train_step", "fixed_anchors", mismatch.PROGRAM)
        )

    # -- the computation --------------------------------------------------------

    @staticmethod
    def _trainable(params, critic):
        params = loralib.adapters_of(params)  # under LoRA the optimiser sees the adapters only
        return params if critic is None else (params, critic)

    def _forward(self, params, critic, batch):
        """(logprobs, entropy, values or None), each [B, T-1], in ``compute_dtype``."""
        dtype = self._compute_dtype
        ids = batch.get("token_ids")  # LoRA dropout's per-token draws (passes.Passes.inputs)
        model = loralib.model_of(self.graphdef, cast_floats(params, dtype), ids)
        model = self._wrap_blocks(model)
        chunk = self.settings.logprob_chunk_tokens  # the head never sees the whole batch
        floor = batch.get("kept_floor")  # the sampler's kept sets: truncate as it did
        mode = self.settings.routing_replay
        routes = batch.get("routes") if mode != "off" else None
        if routes is None and mode == "rollout" and model.cfg.moe:
            raise ValueError(
                "routing_replay = 'rollout' but the batch has no routes: its sampler did not "
                "record them (samplers.jax and samplers.engine do)"
            )
        # R3: the sampler's experts; R2: the first pass's (rlax.core.models.routing_replay)
        if routes is not None:
            if critic is not None:
                raise ValueError(f"routing_replay = {mode!r} with a critic is not supported")
            tokens, mask = batch["tokens"], batch["attention_mask"]
            logp, entropy = replayed_logprobs(
                model, tokens, mask, routes, self.temperature, chunk, batch.get("kept_floor")
            )
            return logp, entropy, None
        if critic is None:
            logp, entropy = sequence_logprobs(
                model, batch["tokens"], batch["attention_mask"], self.temperature, chunk, floor
            )
            return logp, entropy, None
        # Both set in __init__ with the critic's params.
        assert self.critic_graphdef is not None and self.value_model is not None
        module = self._wrap_blocks(nnx.merge(self.critic_graphdef, cast_floats(critic, dtype)))
        tokens, mask = batch["tokens"], batch["attention_mask"]
        return forward_with_values(
            model, self.value_model, module, tokens, mask, self.temperature, chunk, floor
        )

    def _wrap_blocks(self, module: ModuleT) -> ModuleT:
        return wrap_blocks(module, self.settings.remat, self.mesh, self.settings.attention_block)

    def _scan_forward(self, params, critic, batch):
        """``_forward`` over microbatches (no gradient): the whole batch's outputs, [B, L]
        (a packed batch's gathered into the padded layout)."""
        return self.passes.forward_all(lambda mb: self._forward(params, critic, mb), batch)

    def _loss(self, logp, values, batch, entropy=None):
        # A batch that brings train_logprobs / old_values had them fixed for several
        # updates (rlax.core.trainer.epochs); otherwise they are this step's own.
        inputs = dict(batch)
        if entropy is not None:  # with gradient: an entropy bonus (UsesEntropy)
            inputs["entropy"] = entropy
        inputs.setdefault("train_logprobs", jax.lax.stop_gradient(logp))
        if values is not None:
            inputs["values"] = values
            inputs.setdefault("old_values", jax.lax.stop_gradient(values))
        return self.algorithm.loss(logp, inputs)

    def _loss_and_grads(self, params, critic, batch):
        """(loss, metrics, logp, entropy, grads) of the batch (:class:`passes.Passes`)."""

        # The entropy rides with the values when the loss differentiates it, so every
        # pass (microbatches, packing) carries its gradient as it does the values'.
        uses_entropy = isinstance(self.algorithm, UsesEntropy) and self.algorithm.needs_entropy

        def outputs(trainable, inputs):
            p, c = (trainable, None) if critic is None else trainable
            p = loralib.joined(params, p)  # LoRA: the frozen base with these adapters
            logp, entropy, values = self._forward(p, c, inputs)
            logp, values = passes.as_float32(logp, values)
            if uses_entropy:
                return (logp, (values, entropy.astype(jnp.float32))), entropy
            return (logp, values), entropy

        def loss(logp, values):
            if uses_entropy:
                values, entropy = values
                return self._loss(logp, values, batch, entropy)
            return self._loss(logp, values, batch)

        return self.passes.loss_and_grads(
            outputs,
            loss,
            self._trainable(params, critic),
            batch,
        )

    def _train_step(self, params, critic, opt_state, ref_params, batch):
        if ref_params is not None and "ref_logprobs" not in batch:
            ref_logp, _, _ = self._scan_forward(ref_params, None, batch)
            batch = dict(batch, ref_logprobs=jax.lax.stop_gradient(ref_logp.astype(jnp.float32)))
        loss, metrics, logp, entropy, grads = self._loss_and_grads(params, critic, batch)
        moe = self._model_cfg.moe
        load = None
        if moe is not None and (moe.aux_loss_coef > 0 or self._balances_bias):
            aux, aux_grads, load = balancing.terms(self, params, critic, batch)
            metrics = dict(metrics, moe_aux_loss=aux)
            if aux_grads is not None:  # the loss is the algorithm's plus coef x the aux loss
                loss = loss + moe.aux_loss_coef * aux
                grads = jax.tree.map(lambda g, a: g + moe.aux_loss_coef * a, grads, aux_grads)
        old_params = params
        trainable = self._trainable(params, critic)
        updates, opt_state = self.optimizer.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        trained, critic = (trainable, None) if critic is None else trainable
        params = loralib.updated(params, trained)  # LoRA: the same base, the new adapters
        if load is not None and self._balances_bias:  # DeepSeek-V3: after the update
            params = balancing.balanced_bias(self, old_params, params, load)
        mask = batch["loss_mask"]
        metrics = dict(
            metrics,
            **mismatch.mismatch_metrics(logp, batch),
            loss=loss,
            entropy=masked_mean(entropy.astype(jnp.float32), mask),
            grad_norm=optax.tree.norm(grads),
        )
        if self.settings.post_update_kl:
            new_logp, _, _ = jax.lax.stop_gradient(self._scan_forward(params, None, batch))
            # k3 estimator of KL(old || new) on tokens sampled from the old policy:
            # E_old[r - 1 - log r] with r = new / old (Schulman 2020, "Approximating KL").
            d = new_logp.astype(jnp.float32) - logp
            metrics["kl_old"] = masked_mean(jnp.exp(d) - d - 1.0, mask)
        return params, critic, opt_state, metrics

    # -- the API ----------------------------------------------------------------

    def layout(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` packed or padded as the step will run them (:func:`passes.arrange`)."""
        if self.settings.routing_replay == "off" and "routes" in arrays:
            # Recorded routes unused: not carried (they would also rule out prefix sharing).
            arrays = {k: v for k, v in arrays.items() if k != "routes"}
        return passes.arrange(
            arrays, self.settings, self.mesh, self._embed_dim, self.passes.token_ids
        )

    def device_batch(self, batch: TrainBatch | dict[str, Any]) -> dict[str, jax.Array]:
        """The batch as global arrays split over (data, fsdp), packed or padded (:meth:`layout`).

        With several processes (:mod:`rlax.core.parallel.multihost`) each passes its
        own rows (:func:`rlax.core.parallel.multihost.process_rows` of the global batch).
        """
        arrays = batch_arrays(batch) if isinstance(batch, TrainBatch) else dict(batch)
        arrays = self.layout(arrays)
        rows = len(arrays["loss_mask"]) * jax.process_count()
        if rows % meshlib.batch_size_multiple(self.mesh):
            raise ValueError(
                f"batch of {rows} rows does not split over data x fsdp = "
                f"{meshlib.batch_size_multiple(self.mesh)} devices"
            )
        # auto may pad a later batch: a row count that could not be padded is refused now
        if self.settings.packing != "packed" and rows % self.settings.microbatches:
            raise ValueError(
                f"batch of {rows} rows does not split into {self.settings.microbatches} microbatches"
            )
        if jax.process_count() == 1:
            return jax.device_put(arrays, self.batch_shardings(arrays))
        return multihost.global_batch(self.mesh, arrays)

    def _placed(self, s: TrainState) -> TrainState:
        """``s`` laid out as the step expects (a no-op unless it was replaced, e.g. restored)."""
        return TrainState(
            jax.device_put(s.params, self.param_shardings),
            jax.device_put(s.opt_state, self.opt_shardings),
            s.step,
            None if s.critic is None else jax.device_put(s.critic, self.critic_shardings),
        )

    def lower(self, batch: TrainBatch | dict[str, Any]):
        """The step lowered for ``batch`` (inspect its HLO with ``.as_text()``)."""
        arrays = self.device_batch(batch)
        s = self.state
        return self._step_fn(arrays).lower(s.params, s.critic, s.opt_state, self.ref_params, arrays)

    def step(self, batch: TrainBatch | dict[str, Any]) -> dict[str, float]:
        """One optimiser update on ``batch``; returns host-side float metrics."""
        arrays = self.device_batch(batch)
        s = self._placed(self.state)
        params, critic, opt_state, metrics = self._step_fn(arrays)(
            s.params, s.critic, s.opt_state, self.ref_params, arrays
        )
        self.state = TrainState(params, opt_state, s.step + 1, critic)
        return mismatch.unmeasured_dropped(
            {k: float(v) for k, v in jax.device_get(metrics).items()}
        )

    def model(self) -> Transformer:
        """A live model view of the current parameters (under LoRA: the merged weights)."""
        return nnx.merge(self.graphdef, loralib.merged_state(self.state.params))
