"""A hand-written NumPy (float64) forward of a decoder with mixture-of-experts layers.

Written from the formulas (RMSNorm, rotate-half RoPE, grouped-query causal
attention, SwiGLU, top-k routing), not from the model's code: the reference
the tests of ``test_moe.py`` hold :class:`rlax.core.models.transformer.Transformer` to.
Parameters come as the model's pure dict (nnx kernels are [in, out]).
"""

from __future__ import annotations

import numpy as np


def rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def silu(x):
    return x / (1.0 + np.exp(-x))


def rope(x, positions, theta):  # x [T, heads, H]
    half = x.shape[-1] // 2
    freq = theta ** (-np.arange(half) / half)
    angle = positions[:, None, None] * freq  # [T, 1, H/2]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate(
        [x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1
    )


def attention(p, x, cfg):  # one sequence x [T, D], every token real
    t = x.shape[0]
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = (x @ p["q"]["kernel"]).reshape(t, n, h)
    key = (x @ p["k"]["kernel"]).reshape(t, k, h)
    v = (x @ p["v"]["kernel"]).reshape(t, k, h)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"]["scale"], cfg.norm_eps)
        key = rms_norm(key, p["k_norm"]["scale"], cfg.norm_eps)
    pos = np.arange(t, dtype=np.float64)
    q, key = rope(q, pos, cfg.rope_theta), rope(key, pos, cfg.rope_theta)
    out = np.zeros((t, n, h))
    for head in range(n):
        kv = head // (n // k)
        scores = q[:, head] @ key[:, kv].T / np.sqrt(h)
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out[:, head] = probs @ v[:, kv]
    return out.reshape(t, n * h) @ p["o"]["kernel"]


def swiglu(x, gate, up, down):
    return (silu(x @ gate) * (x @ up)) @ down


def moe(p, x, m, replay=None):
    """x [T, D] -> (y [T, D], chosen ids [T, k]); replay [T, k] routes each token instead."""
    logits = x @ p["router"]["kernel"]  # [T, E]
    if m.scoring == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        scores = e / e.sum(-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-logits))
    choice = scores + (p["router_bias"] if m.router_bias else 0.0)
    y = np.zeros_like(x)
    chosen = []
    for i in range(x.shape[0]):
        ids = np.argsort(-choice[i])[: m.experts_per_token] if replay is None else replay[i]
        w = scores[i, ids]
        if m.normalize_topk:
            w = w / w.sum()
        w = w * m.routed_scale
        ex = p["experts"]
        for j, wj in zip(ids, w):
            y[i] += wj * swiglu(x[i], ex["gate"][j], ex["up"][j], ex["down"][j])
        chosen.append(ids)
    if m.shared_mlp_dim:
        s = p["shared"]
        out = swiglu(x, s["gate"]["kernel"], s["up"]["kernel"], s["down"]["kernel"])
        if m.shared_gate:
            out = out / (1.0 + np.exp(-(x @ s["out_gate"]["kernel"])))
        y = y + out
    return y, np.array(chosen)


def forward(params, cfg, tokens, replay=None):
    """Logits [T, V] of one sequence and the chosen experts [T, R, k] of its R sparse layers.

    ``replay`` [T, R, k]: route by these ids instead.
    """
    p = _float64(params)
    x = p["embed"]["embedding"][tokens]
    chosen = []
    for i in range(cfg.num_layers):
        b = p["blocks"][i]
        x = x + attention(b["attn"], rms_norm(x, b["attn_norm"]["scale"], cfg.norm_eps), cfg)
        h = rms_norm(x, b["mlp_norm"]["scale"], cfg.norm_eps)
        if cfg.is_moe_layer(i):
            r = len(chosen)
            y, ids = moe(b["mlp"], h, cfg.moe, None if replay is None else replay[:, r])
            chosen.append(ids)
        else:
            m = b["mlp"]
            y = swiglu(h, m["gate"]["kernel"], m["up"]["kernel"], m["down"]["kernel"])
        x = x + y
    x = rms_norm(x, p["final_norm"]["scale"], cfg.norm_eps)
    head = p["embed"]["embedding"].T if cfg.tie_embeddings else p["head"]["kernel"]
    return x @ head, np.stack(chosen, axis=1)


def _float64(tree):
    if isinstance(tree, dict):
        return {k: _float64(v) for k, v in tree.items()}
    return np.asarray(tree, dtype=np.float64)
