"""The train step's throughput and model-FLOPs utilisation, against a hand-written torch step.

Reference workload (the defaults): a Qwen2-style decoder (vocab 1024, hidden 256,
4 layers, 4 heads, 2 KV heads, head dim 64, MLP 1024, q/k/v bias, untied head),
fp32, 64 sequences x 96 tokens (32 prompt + 64 completion), the GRPO loss
(seq-mean-token-mean clipped surrogate) and adam.

- ``tok_s``: tokens (all B x T positions) per second of rlax's jitted step
  (:class:`rlax.core.trainer.step.Trainer`) on every local device (``--mesh``).
- ``mfu``: ``tok_s`` x model FLOPs per token / ``peak_gflops``. Model FLOPs per
  token of a training step are ``6 N + 12 L n h T`` (PaLM's count: N the
  parameters that multiply activations, the full T x T attention of n heads of
  size h in each of L layers, forward and backward).
- ``peak_gflops``: the best rate of a large fp32 matmul measured in the same
  run, on the same devices, with the same matmul precision.
- ``torch_tok_s`` / ``vs_torch``: the same model, batch, loss and optimiser
  written directly in torch (SDPA attention, ``torch.optim.Adam``), started
  from the same weights, when torch is importable; ``null`` otherwise. Its
  first loss is checked against ours on a batch whose old logprobs lie near
  the policy's (:func:`near_policy`), so the check reaches the forward pass.

The trainer runs with ``post_update_kl=False`` so both steps do the same work
(forward, loss, backward, adam, the loss's metrics); ``--kl-old`` also times
the trainer's default, which adds one forward pass to measure KL(old || new)
(``tok_s_with_kl_old``).

Backend-agnostic: on a GPU the same script measures the GPU (torch on CUDA
when available). The last line of output is the JSON result.

Usage: python benchmarks/train_step.py [--steps 3] [--batch 64 --seq 96 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.host_memory import reuse_freed_memory
from rlax.core.parallel.mesh import MeshConfig, make_mesh, param_name
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.trainer.teacher import Teacher
from rlax.plugins.algorithms.grpo import grpo


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--mlp", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=96)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens of each row")
    p.add_argument("--steps", type=int, default=4, help="timed rounds (after one warm-up)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--remat", default="none")
    p.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor sizes")
    p.add_argument("--peak-size", type=int, default=0, help="matmul size (0: by backend)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--kl-old", action="store_true", help="also time the default step (+kl_old)")
    return p.parse_args(argv)


SETTLE_S = 0.2  # pause after each timed probe (see main)


def model_config(a: argparse.Namespace) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=a.vocab,
        num_layers=a.layers,
        embed_dim=a.hidden,
        num_heads=a.heads,
        num_kv_heads=a.kv_heads,
        head_dim=a.head_dim,
        mlp_dim=a.mlp,
        rope_theta=1_000_000.0,
        tie_embeddings=False,
        qkv_bias=True,
    )


def flops_per_token(cfg: TransformerConfig, seq: int) -> float:
    """Training FLOPs per token: 6 N (matmul parameters) + 12 L n h T (attention)."""
    d, n, k, h, f = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    per_layer = d * (n + 2 * k) * h + n * h * d + 3 * d * f
    matmul_params = cfg.num_layers * per_layer + d * cfg.vocab_size  # the output head
    return 6 * matmul_params + 12 * cfg.num_layers * n * h * seq


def make_batch(a: argparse.Namespace, seed: int = 0) -> dict[str, np.ndarray]:
    """Left-padded prompts (up to 8 pads) and completions of unequal length (at least half)."""
    rng = np.random.default_rng(seed)
    b, t, p = a.batch, a.seq, a.prompt
    pad = rng.integers(0, 9, size=b)
    end = t - rng.integers(0, (t - p) // 2 + 1, size=b)
    pos = np.arange(t)
    attention = (pos >= pad[:, None]) & (pos < end[:, None])
    tokens = np.where(attention, rng.integers(1, a.vocab, size=(b, t)), 0).astype(np.int32)
    # A target needs a real token before it (a row whose pads reach past p has no prompt).
    real = attention[:, :-1] & attention[:, 1:]
    loss_mask = (real & (pos[1:] >= p)).astype(np.float32)
    groups = rng.normal(size=(b // 8 if b >= 8 else 1, 8)).reshape(-1)[:b]
    adv = np.repeat(groups[:, None], t - 1, axis=1).astype(np.float32) * loss_mask
    old = (-rng.random((b, t - 1)) * 3 * loss_mask).astype(np.float32)
    return {
        "tokens": tokens,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "old_logprobs": old,
        "advantages": adv,
    }


def near_policy(
    batch: dict[str, np.ndarray], model: Transformer, *, spread: float = 0.4, seed: int = 1
) -> dict[str, np.ndarray]:
    """``batch`` with ``old_logprobs`` within ``spread`` nats of ``model``'s own logprobs.

    The ratios new/old then lie in [e^-spread, e^spread] ([0.67, 1.49] at 0.4), around
    GRPO's clip range [0.8, 1.2]: the first step's loss depends on the policy's
    logprobs, clipped tokens and unclipped ones, so comparing two steps' first losses
    checks their forward passes. (Old logprobs drawn at random, far from the policy's,
    clip almost every token: the loss is then the advantages' alone.)
    """
    logp = Teacher(model).logprobs(batch)
    noise = np.random.default_rng(seed).uniform(-spread, spread, size=logp.shape)
    old = ((logp + noise) * batch["loss_mask"]).astype(np.float32)
    return {**batch, "old_logprobs": old}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def make_matmul(size: int):
    """(run, flops): a chain of large fp32 matmuls, one per local device (the peak's probe)."""
    devices = jax.local_devices()
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    x = jax.device_put(jnp.ones((len(devices), size, size), jnp.float32) / size, spec)
    chain = 4

    @jax.jit
    def run(x):
        for _ in range(chain):
            x = jnp.einsum("bij,bjk->bik", x, x)
        return x

    run(x).block_until_ready()
    return (lambda: run(x).block_until_ready()), chain * 2 * size**3 * len(devices)


def make_jax_step(a, cfg, batch, *, post_update_kl: bool):
    """(step, the first step's loss) of rlax's step; the first step compiles."""
    mesh = make_mesh(MeshConfig(*(int(x) for x in a.mesh.split(","))), jax.local_devices())
    settings = TrainerSettings(
        microbatches=a.microbatches,
        remat=a.remat,
        compute_dtype=a.dtype,
        post_update_kl=post_update_kl,
    )
    trainer = Trainer(
        Transformer(cfg, rngs=nnx.Rngs(0)), grpo(), optax.adam(1e-5), mesh=mesh, settings=settings
    )
    arrays = trainer.device_batch(batch)
    first_loss = trainer.step(arrays)["loss"]
    return (lambda: trainer.step(arrays)), first_loss


def make_torch_step(cfg: TransformerConfig, weights: dict[str, np.ndarray], batch):
    """(step, first loss, device) of the same step written directly in torch."""
    import torch
    import torch.nn.functional as F

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(os.cpu_count() or 1)
    # JAX's default fp32 matmul precision on GPU allows TF32; give torch the same.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    w = {k: torch.tensor(v, device=device, requires_grad=True) for k, v in weights.items()}
    b = {k: torch.tensor(v, device=device) for k, v in batch.items()}
    n, k, h, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.norm_eps
    tokens, valid = b["tokens"].long(), b["attention_mask"]
    bsz, t = tokens.shape
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0).float()
    freq = cfg.rope_theta ** (-torch.arange(h // 2, device=device).float() / (h // 2))
    angle = positions[..., None] * freq  # [B, T, H/2]
    cos, sin = angle.cos()[:, :, None], angle.sin()[:, :, None]
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    allowed = causal[None] & valid[:, None, :]
    bias = torch.where(allowed, 0.0, -1e9)[:, None]  # [B, 1, T, T]; all-masked rows: uniform

    def rms(x, scale):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale

    def proj(y, name):  # q/k/v, with the bias where the model has one (Qwen2: yes, Llama: no)
        out = y @ w[name + "/kernel"]
        return out + w[name + "/bias"] if name + "/bias" in w else out

    def rope(x):  # [B, T, heads, H]
        x1, x2 = x[..., : h // 2], x[..., h // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward():
        x = w["embed/embedding"][tokens]
        for i in range(cfg.num_layers):
            p = f"blocks/{i}/"
            y = rms(x, w[p + "attn_norm/scale"])
            q = proj(y, p + "attn/q").view(bsz, t, n, h)
            kk = proj(y, p + "attn/k").view(bsz, t, k, h)
            v = proj(y, p + "attn/v").view(bsz, t, k, h)
            q, kk, v = rope(q).transpose(1, 2), rope(kk).transpose(1, 2), v.transpose(1, 2)
            o = F.scaled_dot_product_attention(q, kk, v, attn_mask=bias, enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(bsz, t, n * h) @ w[p + "attn/o/kernel"]
            y = rms(x, w[p + "mlp_norm/scale"])
            gate, up = y @ w[p + "mlp/gate/kernel"], y @ w[p + "mlp/up/kernel"]
            x = x + (F.silu(gate) * up) @ w[p + "mlp/down/kernel"]
        head = w["head/kernel"] if "head/kernel" in w else w["embed/embedding"].T  # tied
        logits = rms(x, w["final_norm/scale"]) @ head
        logp_all = torch.log_softmax(logits[:, :-1].float(), -1)
        logp = logp_all.gather(-1, tokens[:, 1:, None])[..., 0]
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    def grpo_loss(logp):  # clipped surrogate, seq-mean-token-mean (as rlax's grpo())
        mask, adv = b["loss_mask"], b["advantages"]
        ratio = (logp - b["old_logprobs"]).exp()
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        seq_tokens = mask.sum(-1)
        has = (seq_tokens > 0).float()
        per_seq = (per_token * mask).sum(-1) / seq_tokens.clamp(min=1.0)
        return (per_seq * has).sum() / has.sum().clamp(min=1.0)

    opt = torch.optim.Adam(list(w.values()), lr=1e-5, eps=1e-8, foreach=True)

    def step():
        opt.zero_grad(set_to_none=True)
        logp, entropy = forward()
        loss = grpo_loss(logp)
        loss.backward()
        opt.step()
        entropy_mean = (entropy * b["loss_mask"]).sum() / b["loss_mask"].sum()
        return loss.item(), entropy_mean.item()

    first_loss, _ = step()
    return step, first_loss, device


def main(argv: list[str]) -> dict:
    a = parse_args(argv)
    host_malloc = reuse_freed_memory()  # as `rlax run` does, before JAX starts its backend
    cfg = model_config(a)
    start_model = Transformer(cfg, rngs=nnx.Rngs(0))  # the weights both steps start from
    batch = near_policy(make_batch(a), start_model)
    backend = jax.default_backend()
    tokens = a.batch * a.seq
    fpt = flops_per_token(cfg, a.seq)
    result = {
        "backend": backend,
        "devices": jax.local_device_count(),
        "host_malloc": host_malloc,
        "model_params": cfg.num_params(),
        "tokens_per_step": tokens,
        "gflop_per_step": round(fpt * tokens / 1e9, 2),
    }
    matmul, matmul_flops = make_matmul(a.peak_size or (8192 if backend != "cpu" else 1024))
    probes = {"matmul": matmul}
    start = time.perf_counter()
    probes["jax"], result["jax_loss_step0"] = make_jax_step(a, cfg, batch, post_update_kl=False)
    result["jax_compile_s"] = round(time.perf_counter() - start, 1)
    if a.kl_old:
        probes["jax_kl_old"], _ = make_jax_step(a, cfg, batch, post_update_kl=True)
    if not a.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            result["torch"] = "not installed"
        else:
            weights = {
                param_name(p): np.asarray(x)
                for p, x in jax.tree_util.tree_flatten_with_path(nnx.split(start_model)[1])[0]
            }
            probes["torch"], loss, result["torch_device"] = make_torch_step(cfg, weights, batch)
            result["torch_loss_step0"] = loss
            # torch runs in fp32; a bf16 step's logprobs carry bf16's rounding (2^-8)
            tol = 1e-4 if a.dtype == "float32" else 2.0**-8
            if not math.isclose(loss, result["jax_loss_step0"], abs_tol=tol):
                raise SystemExit(f"torch step's loss {loss} != rlax's {result['jax_loss_step0']}")
    # Rounds of one of each, best time of each: on a shared machine every probe
    # gets the same chances of a quiet moment. A pause after each probe lets its
    # library's worker threads go idle: torch's OpenMP threads keep spinning for
    # a while after a call, and on a CPU a probe timed in that window loses a
    # third of its speed to them (measured here: an XLA matmul timed right after
    # a torch one ran 16 ms alone, 23 ms after torch, 16 ms after a 10 ms pause).
    best = dict.fromkeys(probes, math.inf)
    for _ in range(a.steps):
        for name, probe in probes.items():
            best[name] = min(best[name], timed(probe))
            time.sleep(SETTLE_S)
    peak = matmul_flops / best["matmul"] / 1e9
    tok_s = tokens / best["jax"]
    torch_tok_s = tokens / best["torch"] if "torch" in best else None
    if "jax_kl_old" in best:
        result["tok_s_with_kl_old"] = round(tokens / best["jax_kl_old"], 1)
    result.update(
        tok_s=round(tok_s, 1),
        mfu=round(tok_s * fpt / (peak * 1e9), 3),
        peak_gflops=round(peak, 1),
        torch_tok_s=None if torch_tok_s is None else round(torch_tok_s, 1),
        vs_torch=None if torch_tok_s is None else round(tok_s / torch_tok_s, 3),
    )
    return result


if __name__ == "__main__":
    out = main(sys.argv[1:])
    for key, value in out.items():
        print(f"{key:>20}: {value}", file=sys.stderr)
    print(json.dumps(out))
