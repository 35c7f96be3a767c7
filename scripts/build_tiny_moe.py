"""Builds the tiny random mixture-of-experts checkpoint of the tests: an HF Qwen3-MoE directory.

No hub access here, so the MoE tests read a model written by rlax itself:
``config.json`` (model_type ``qwen3_moe``: 3 layers, layer 0 dense through
``mlp_only_layers``, 8 experts of which 2 per token, renormalised) and
``model.safetensors`` (~150 KB), every weight drawn from NumPy's generator with
a fixed seed (norm scales near 1), so the files are the same on every machine.
Run from the repository root::

    python scripts/build_tiny_moe.py            # writes assets/tiny-moe
"""

from __future__ import annotations

import argparse
import pathlib

import jax
import numpy as np
from flax import nnx

from rlax.core.models.config import MoeConfig, TransformerConfig
from rlax.core.models.hf import model_from_params, save_hf_model
from rlax.core.models.transformer import abstract_transformer

CONFIG = TransformerConfig(
    vocab_size=96,
    num_layers=3,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=48,
    rope_theta=10_000.0,
    norm_eps=1e-6,
    tie_embeddings=False,
    qk_norm=True,
    moe=MoeConfig(
        num_experts=8,
        experts_per_token=2,
        expert_mlp_dim=16,
        normalize_topk=True,
        dense_layers=(0,),
    ),
)


def random_params(cfg: TransformerConfig, seed: int) -> dict:
    """Every parameter of ``cfg`` drawn from N(0, 1/fan_in) (norm scales 1 + N(0, 0.1))."""
    rng = np.random.default_rng(seed)
    shapes = nnx.to_pure_dict(nnx.state(abstract_transformer(cfg)))

    def draw(path, leaf):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        if name.endswith("scale"):
            return (1.0 + 0.1 * rng.standard_normal(leaf.shape)).astype(np.float32)
        fan_in = leaf.shape[-2] if len(leaf.shape) >= 2 else leaf.shape[-1]
        return (rng.standard_normal(leaf.shape) / np.sqrt(fan_in)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="assets/tiny-moe")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    model = model_from_params(CONFIG, random_params(CONFIG, args.seed))
    save_hf_model(out, model)
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir())} bytes)")


if __name__ == "__main__":
    main()
