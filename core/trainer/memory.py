"""The trainer's estimate of its activation memory per device, before it runs.

A step's activation memory is what the backward pass needs of the forward pass
(the residuals JAX saves, :func:`jax.checkpoint`'s policy deciding which), for
one microbatch at a time (:mod:`rlax.core.trainer.microbatch`), on each device.
With n rows of W tokens per device and microbatch, split over c devices by the
``context`` axis (each holds n x W / c tokens' activations and their queries'
scores against all W keys), a layer saves, in the compute dtype (b bytes):

- attention's scores: n x N x (W / c) x W elements, three times (the masked
  scores and the softmax's output, b each, and its float32 exponentials) plus
  the mask's broadcast (1 byte); with the sequence split (c > 1) the product
  runs unflattened and one b-byte copy less stays;
- in blocks (``attention_block`` > 0, :mod:`rlax.core.models.block_attention`), no
  scores: the float32 queries, keys, values and output the loops read and write,
  about 3 N H + 4 K H + 2 N float32 a token (fitted as below, 512-2,048 tokens), and
  the row's [W, W] boolean mask (1 byte an element) per layer, and the loops'
  temporaries, about eight float32 [N, block, block] arrays a layer (one block's scores,
  probabilities and their gradients at a time);
- per token: the residual stream and attention's output, about 1.25 (D + N H)
  elements (the RMSNorms' inputs and outputs, queries, less what XLA fuses
  away), and the MLP's gate, up, SiLU and product, about 5.5 F; keys and values
  (2 K H) count separately when context parallelism gathers them whole (n x W
  tokens, not n x W / c).

Rematerialisation keeps less between the passes and recomputes one layer at a
time in the backward pass: ``"block"`` saves each block's input (D per token)
and the mask once, ``"block_dots"`` also the projections' outputs (N H + 2 K H
+ D + 2 F + D per token); either adds one layer's full set for the recompute.
The output head (chunked, :mod:`rlax.core.models.logprobs`) keeps about eight
D-wide arrays per token of the whole row (its chunks walk positions, so under context
parallelism it gathers the row's hidden states).

The per-token coefficients are the residuals JAX saves as XLA:CPU keeps them
(fitted over 30 shapes of 1-4 layers, D 64-256, 64-1024 tokens a row); XLA's
buffer assignment on another backend may keep more or fewer at once. Measured on XLA:CPU (``compiled.memory_analysis()``,
``benchmarks/long_context.py``) the estimate is within 15% without remat; XLA:CPU
does not realise remat's savings (its peak is the no-remat one), so there the
remat figures are the saved residuals' (:func:`jax.ad_checkpoint` accounting).
"""

from __future__ import annotations

import dataclasses

from rlax.core.models.config import TransformerConfig

BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes per device of one microbatch, and what they are made of."""

    total: int
    per_layer: int
    head: int
    recompute: int
    tokens: int  # this device's tokens per microbatch (rows x width / context)

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"activation memory estimate per device: {self.total / gib:.3f} GiB "
            f"({self.tokens} tokens a microbatch; {self.per_layer / gib:.4f} GiB a layer, "
            f"head {self.head / gib:.4f}, recompute {self.recompute / gib:.4f})"
        )


def activation_bytes(
    cfg: TransformerConfig,
    rows: int,
    width: int,
    context: int = 1,
    remat: str = "none",
    dtype: str = "float32",
    attention_block: int = 0,
) -> ActivationEstimate:
    """The estimate of the module docstring for ``rows`` rows of ``width`` tokens per device
    and microbatch, split over ``context`` devices along the sequence, attention dense
    or in blocks (``attention_block`` > 0)."""
    b = BYTES[dtype]
    d, f, heads, kv, h = cfg.embed_dim, cfg.mlp_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    local = -(-width // context)  # this device's share of each row
    tokens = rows * local
    copies = 2 * b + 4 + 1 if context == 1 else b + 4 + 1
    scores = rows * heads * local * width * copies
    if attention_block and context == 1:
        scores = tokens * (3 * heads * h + 4 * kv * h + 2 * heads) * 4 + rows * width * width
        scores += 8 * heads * attention_block**2 * 4  # the loop's block-sized temporaries
    keys = rows * width * 2 * kv * h * b if context > 1 else 0
    linear = tokens * (1.25 * (d + heads * h) + 5.5 * f) * b
    full = float(scores + keys + linear)
    head = 8 * rows * width * d * b
    if remat == "none":
        per_layer, recompute = full, 0.0
    elif remat == "block":
        per_layer, recompute = float(tokens * d * b), full
    else:  # block_dots
        per_layer, recompute = float(tokens * (heads * h + 2 * kv * h + 2 * d + 2 * f) * b), full
    mask = rows * local * width if remat != "none" else 0
    total = cfg.num_layers * per_layer + head + recompute + mask
    return ActivationEstimate(int(total), int(per_layer), int(head), int(recompute), tokens)
