"""The mixture-of-experts MLP: a router, routed SwiGLU experts, an optional shared expert.

For each token x [D] the router's logits are ``x @ W_r`` [E]; the scores are
``softmax`` over them or ``sigmoid`` of each. The k experts chosen are the top
k of ``scores + b`` (``b`` the DeepSeek-V3 balancing bias, zero without it);
their weights are the chosen *scores* (never the bias), renormalised to sum 1
when ``normalize_topk``, times ``routed_scale``. The output is

    y = sum_j w_j * SwiGLU_{e_j}(x)  [+ g(x) * SwiGLU_shared(x)]

with ``g(x) = sigmoid(x . w_g)`` under ``shared_gate`` and 1 otherwise.

No token is dropped: ``dispatch = "sorted"`` sorts the N*k (token, expert)
pairs by expert and runs each projection as one grouped matmul
(``jax.lax.ragged_dot``: the work of k dense MLPs of width F per token);
``"dense"`` runs every expert on every token and masks the combine (E/k times
that work; for tiny models and as the reference).

**Routing replay.** Given ``routes`` [N, k] (expert ids recorded by a sampler,
-1 where none was), a token is sent to those experts instead of its own top k;
its weights are still the router's scores at those ids, so the router's
parameters get their gradient through them.

References:
  Shazeer et al., 2017, https://arxiv.org/abs/1701.06538 (sparsely-gated MoE)
  Fedus et al., 2021, https://arxiv.org/abs/2101.03961 (Switch: the balancing loss)
  Jiang et al., 2024, https://arxiv.org/abs/2401.04088 (Mixtral)
  DeepSeek-AI, 2024, https://arxiv.org/abs/2412.19437 (V3: sigmoid scores, bias balancing)
  Ma et al., 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
    Inference Routers" (routing replay, R3)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.layers import Attention

__all__ = [
    "Experts",
    "MoE",
    "MoeBlock",
    "RoutesOut",
    "Routing",
    "balance_bias",
    "balancing_terms",
    "route",
]


@jax.tree_util.register_dataclass  # a block's output: through remat and scans
@dataclasses.dataclass(frozen=True)
class Routing:
    """One sparse layer's routing of N tokens.

    Attributes:
      ids: int32 [N, k], the experts each token went to.
      weights: [N, k], their combine weights.
      probs: float32 [N, E], the router's scores (softmax or sigmoid), for the
        balancing loss.
    """

    ids: jax.Array
    weights: jax.Array
    probs: jax.Array


@jax.tree_util.register_dataclass  # a block's output: through remat and scans
@dataclasses.dataclass(frozen=True)
class RoutesOut:
    """A whole model's routing of a call (its R sparse layers in order).

    Attributes:
      ids: int32 [B, T, R, k], the experts each token went to in each sparse
        layer: what a sampler records for routing replay.
      aux_loss: float32 [], the load-balancing loss, mean over the sparse
        layers (over every position of the call, padding included; the train
        step's is :func:`balancing_terms`, over its real tokens).
      probs: float32 [B, T, R, E], the router's scores (None where not kept).
    """

    ids: jax.Array
    aux_loss: jax.Array
    probs: jax.Array | None = None


def route(
    logits: jax.Array,  # [N, E]
    cfg: MoeConfig,
    bias: jax.Array | None = None,  # [E]
    replay: jax.Array | None = None,  # [N, k] int, -1: route this token itself
) -> Routing:
    """The experts and weights of each token (see the module docstring)."""
    logits = logits.astype(jnp.float32)
    if cfg.scoring == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits)
    choice = scores if bias is None else scores + jax.lax.stop_gradient(bias.astype(jnp.float32))
    _, ids = jax.lax.top_k(jax.lax.stop_gradient(choice), cfg.experts_per_token)
    if replay is not None:
        replay = replay.astype(ids.dtype)
        ids = jnp.where((replay >= 0).all(-1, keepdims=True), replay, ids)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if cfg.normalize_topk:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return Routing(ids.astype(jnp.int32), weights * cfg.routed_scale, scores)


def load_balancing_loss(routing: Routing, num_experts: int) -> jax.Array:
    """Switch/Mixtral's E * sum_e f_e * P_e: f_e the fraction of the N*k choices that
    went to e, P_e the mean score of e (sigmoid scores normalised per token first).
    1 when the load is uniform, E when one expert takes everything."""
    chosen = jax.nn.one_hot(routing.ids, num_experts, dtype=jnp.float32).sum(1)  # [N, E]
    f = jnp.mean(chosen, axis=0) / routing.ids.shape[-1]
    p = routing.probs / jnp.sum(routing.probs, axis=-1, keepdims=True)
    return num_experts * jnp.sum(f * jnp.mean(p, axis=0))


def balancing_terms(
    routes: RoutesOut, num_experts: int, valid: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The train step's balancing terms over the ``valid`` [B, T] tokens of a call: the
    load-balancing loss (:func:`load_balancing_loss` of each sparse layer over those tokens,
    mean over the layers; its gradient reaches the router through P_e only) and each layer's
    expert load [R, E] (how many of them chose each expert, for :func:`balance_bias`)."""
    assert routes.probs is not None, "balancing_terms needs the router's scores"
    w = valid.astype(jnp.float32)[..., None, None]  # [B, T, 1, 1]
    chosen = jax.nn.one_hot(routes.ids, num_experts, dtype=jnp.float32).sum(-2) * w
    load = chosen.sum((0, 1))  # [R, E]
    n = jnp.maximum(jnp.sum(w), 1.0)
    f = load / (n * routes.ids.shape[-1])
    p = routes.probs / jnp.sum(routes.probs, axis=-1, keepdims=True)
    mean_p = jnp.sum(p * w, axis=(0, 1)) / n  # [R, E]
    aux = jnp.mean(num_experts * jnp.sum(f * mean_p, axis=-1))
    return aux, jax.lax.stop_gradient(load)


def expert_load(ids: jax.Array, num_experts: int, valid: jax.Array | None = None) -> jax.Array:
    """float32 [E]: how many (valid) tokens chose each expert."""
    chosen = jax.nn.one_hot(ids, num_experts, dtype=jnp.float32).sum(-2)  # [..., E]
    if valid is not None:
        chosen = chosen * valid[..., None].astype(jnp.float32)
    return chosen.reshape(-1, num_experts).sum(0)


def balance_bias(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
    """DeepSeek-V3's auxiliary-loss-free update: b_e += rate * sign(mean load - load_e).

    An overloaded expert's bias goes down (it is chosen less), an underloaded
    one's up; the weights of the chosen experts never see the bias.
    """
    return bias + rate * jnp.sign(jnp.mean(load) - load)


def mlp_output(out: jax.Array | tuple[jax.Array, Routing]) -> jax.Array:
    """A block's MLP output whichever MLP it has: a dense one's array, a :class:`MoE`'s first."""
    return out[0] if isinstance(out, tuple) else out


class Experts(nnx.Module):
    """E SwiGLU MLPs as stacked kernels: gate, up [E, D, F]; down [E, F, D]."""

    def __init__(self, num: int, dim: int, hidden: int, *, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.gate = nnx.Param(init(rngs.params(), (num, dim, hidden)))
        self.up = nnx.Param(init(rngs.params(), (num, dim, hidden)))
        self.down = nnx.Param(init(rngs.params(), (num, hidden, dim)))

    def sorted(self, x: jax.Array, ids: jax.Array, weights: jax.Array) -> jax.Array:
        """x [N, D], ids / weights [N, k] -> [N, D] by grouped matmuls over the pairs."""
        n, k = ids.shape
        num = self.gate.shape[0]
        flat = ids.reshape(-1)
        order = jnp.argsort(flat, stable=True)  # pairs grouped by expert
        rows = x[order // k]  # [N*k, D]
        sizes = jnp.bincount(flat, length=num).astype(jnp.int32)
        dtype = x.dtype
        gate, up, down = (w.astype(dtype) for w in (self.gate[...], self.up[...], self.down[...]))
        h = jax.nn.silu(jax.lax.ragged_dot(rows, gate, sizes))
        h = h * jax.lax.ragged_dot(rows, up, sizes)
        y = jax.lax.ragged_dot(h, down, sizes)  # [N*k, D] in sorted order
        y = jnp.zeros_like(y).at[order].set(y).reshape(n, k, -1)
        return jnp.einsum("nkd,nk->nd", y, weights.astype(dtype))

    def dense(self, x: jax.Array, ids: jax.Array, weights: jax.Array) -> jax.Array:
        """The same by every expert on every token, the combine masked: E/k times the work."""
        num = self.gate.shape[0]
        combine = jnp.einsum(
            "nke,nk->ne", jax.nn.one_hot(ids, num, dtype=x.dtype), weights.astype(x.dtype)
        )
        gate, up, down = (w.astype(x.dtype) for w in (self.gate[...], self.up[...], self.down[...]))
        h = jax.nn.silu(jnp.einsum("nd,edf->enf", x, gate)) * jnp.einsum("nd,edf->enf", x, up)
        y = jnp.einsum("enf,efd->end", h, down)
        return jnp.einsum("end,ne->nd", y, combine)


class SharedExpert(nnx.Module):
    """The SwiGLU MLP every token goes through, optionally gated (Qwen2-MoE)."""

    def __init__(self, dim: int, hidden: int, gated: bool, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(hidden, dim, use_bias=False, rngs=rngs)
        if gated:
            self.out_gate = nnx.Linear(dim, 1, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.down(jax.nn.silu(self.gate(x)) * self.up(x))
        if hasattr(self, "out_gate"):
            y = y * jax.nn.sigmoid(self.out_gate(x))
        return y


class MoE(nnx.Module):
    """The sparse MLP of one layer: ``moe(x, replay) -> (y, routing)``, x [B, T, D]."""

    def __init__(self, cfg: MoeConfig, dim: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.router = nnx.Linear(dim, cfg.num_experts, use_bias=False, rngs=rngs)
        if cfg.router_bias:
            self.router_bias = nnx.Param(jnp.zeros((cfg.num_experts,), jnp.float32))
        self.experts = Experts(cfg.num_experts, dim, cfg.expert_mlp_dim, rngs=rngs)
        if cfg.shared_mlp_dim:
            self.shared = SharedExpert(dim, cfg.shared_mlp_dim, cfg.shared_gate, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        replay: jax.Array | None = None,  # [B, T, k] int, -1: not replayed
    ) -> tuple[jax.Array, Routing]:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])  # [N, D]
        bias = self.router_bias[...] if self.cfg.router_bias else None
        flat_replay = None if replay is None else replay.reshape(rows.shape[0], -1)
        routing = route(self.router(rows), self.cfg, bias, flat_replay)
        combine = self.experts.sorted if self.cfg.dispatch == "sorted" else self.experts.dense
        y = combine(rows, routing.ids, routing.weights)
        if self.cfg.shared_mlp_dim:
            y = y + self.shared(rows)
        return y.reshape(shape), routing


class MoeBlock(nnx.Module):
    """A decoder block whose MLP is :class:`MoE`: ``Block``'s call with ``replay`` [B, T, k]
    last, returning ``(x, cache, routing)``."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        assert cfg.moe is not None
        self.attn_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(cfg.embed_dim, epsilon=cfg.norm_eps, rngs=rngs)
        self.mlp = MoE(cfg.moe, cfg.embed_dim, rngs=rngs)

    def __call__(self, x, rope, attn_mask, cache, cache_index, replay=None):
        h, cache = self.attn(self.attn_norm(x), rope, attn_mask, cache, cache_index)
        x = x + h
        y, routing = self.mlp(self.mlp_norm(x), replay)
        return x + y, cache, routing
