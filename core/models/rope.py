"""Rotary position embeddings (RoPE): frequencies, their cos/sin tables, the rotation.

Shapes as in :mod:`rlax.core.models.transformer` (B batch, T length, H head dim).

References:
  Su et al., 2021, https://arxiv.org/abs/2104.09864 (RoPE)
  Meta, 2024, https://arxiv.org/abs/2407.21783 (Llama 3: RoPE frequency scaling)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlax.core.models.config import RopeScaling


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """Angular frequency of each rotated pair, [H/2]: theta^(-2i/H), then scaled.

    The llama3 rule follows Meta's reference code for Llama 3.1 (wavelength
    bands set by ``original_max_position / {low,high}_freq_factor``).
    """
    half = head_dim // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    if scaling is None:
        return freq
    if scaling.kind == "linear":
        return freq / scaling.factor
    wavelen = 2 * math.pi / freq
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * freq / scaling.factor + smooth * freq
    return jnp.where(
        wavelen > low_wavelen,
        freq / scaling.factor,
        jnp.where(wavelen < high_wavelen, freq, blended),
    )


def rope_tables(
    positions: jax.Array, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) of angle position * frequency_i, each [B, T, 1, H/2], for :func:`rotate`.

    A forward pass computes them once for all its layers, as arrays of their
    own: otherwise XLA recomputes the sines and cosines inside every fusion
    that rotates q or k, forward and backward, once per output element
    (measured: ~71 ms of the ~1.1 s benchmark train step).

    Args:
      positions: [B, T] integer positions.
      head_dim: H, the size of each rotated head.
      theta: the RoPE base.
      scaling: optional frequency scaling (:func:`rope_frequencies`).
    """
    freq = rope_frequencies(head_dim, theta, scaling)  # [H/2]
    angle = positions[..., None].astype(jnp.float32) * freq  # [B, T, H/2]
    tables = jnp.stack([jnp.cos(angle), jnp.sin(angle)])[:, :, :, None, :]
    # An exact no-op on float32 that XLA does not fuse into the tables' consumers:
    # without it every rotation recomputes the sines and cosines for each of its
    # output elements (measured: 4 ms of each rotation's 5 on the benchmark step).
    tables = jax.lax.reduce_precision(tables, exponent_bits=8, mantissa_bits=23)
    return tables[0], tables[1]


def rotate(x: jax.Array, tables: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotates feature pairs (i, i + H/2) of x [B, T, heads, H] by the angles of ``tables``.

    This is the "rotate half" layout of HF checkpoints; llama.cpp's GGUF
    files store q/k rows interleaved instead (see ``gguf.py``).
    """
    cos, sin = tables
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def apply_rope(
    x: jax.Array, positions: jax.Array, theta: float, scaling: RopeScaling | None = None
) -> jax.Array:
    """RoPE of x [B, T, heads, H] at ``positions`` [B, T]: :func:`rotate` by :func:`rope_tables`."""
    return rotate(x, rope_tables(positions, x.shape[-1], theta, scaling))
