"""Run by test_sampler_mesh.py in a process with 8 fake CPU devices: each sampler on one
device and on a 4-device mesh (devices 4-7, as a sampler's sub-mesh is in one process),
the same prompts and seeds; prints one JSON line of what the test asserts."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.tokenizer import CharTokenizer
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.mesh import MeshConfig
from rlax.core.types import Prompt
from rlax.plugins.samplers.engine import SlotEngine
from rlax.plugins.samplers.jax_sampler import JaxSampler

TOK = CharTokenizer("0123456789+=")
CFG = TransformerConfig(
    vocab_size=TOK.vocab_size,
    num_layers=2,
    embed_dim=32,
    num_heads=4,
    num_kv_heads=4,
    head_dim=8,
    mlp_dim=64,
)
PROMPTS = [
    Prompt(id=t, text=t, tokens=TOK.encode(t, bos=True), answer="")
    for t in ("7+5=", "123+45=", "1=")
]
SAMPLERS = {
    "jax": (JaxSampler, {"max_new_tokens": 12, "stop_at_eos": False}),
    "engine": (
        SlotEngine,
        {
            "slots": 4,
            "chunk": 4,
            "max_new_tokens": 12,
            "stop_at_eos": False,
            "max_prompt_tokens": 12,
        },
    ),
}
# Heads over 4 devices; rows over 2 and heads over 2 (the cache split both ways).
# devices_only: no mesh setting, only the devices (tensor parallel over them).
MESHES = {
    "tensor4": MeshConfig(1, 1, 4),
    "data2_tensor2": MeshConfig(2, 1, 2),
    "devices_only": None,
}


def run(sampler, seeds):
    return [sampler.generate(PROMPTS, 3, seed=s) for s in seeds]


def flat(calls, field):
    return [getattr(c, field) for call in calls for group in call for c in group]


def compare(name, mesh_name, model):
    cls, kw = SAMPLERS[name]
    one = cls(**kw)
    one.setup(model, TOK)
    sharded = cls(**kw, mesh=MESHES[mesh_name])
    sharded.devices = jax.devices()[4:]
    sharded.setup(model, TOK)
    seeds = [0, 1, 2]
    ref, got = run(one, seeds[:1]), run(sharded, seeds[:1])
    warm = sharded.compiles
    ref += run(one, seeds[1:])
    got += run(sharded, seeds[1:])
    leaves = jax.tree.leaves(sharded._state)
    kept = getattr(sharded, "_slots", None) or sharded._cache  # the engine's slots, or the cache
    caches = [x for x in jax.tree.leaves(kept) if x.ndim == 4]
    split = [x for x in leaves if not x.sharding.is_fully_replicated]
    return {
        "tokens_equal": all(
            np.array_equal(a, b) for a, b in zip(flat(ref, "tokens"), flat(got, "tokens"))
        ),
        "max_logprob_diff": max(
            float(np.max(np.abs(a - b), initial=0.0))
            for a, b in zip(flat(ref, "logprobs"), flat(got, "logprobs"))
        ),
        "compiles_warm": warm,
        "compiles_after": sharded.compiles,
        "devices": sorted({d.id for x in leaves for d in x.devices()}),
        "split_leaves": len(split),
        "caches_split": bool(caches) and all(not x.sharding.is_fully_replicated for x in caches),
        "shards_of_a_split_leaf": len({str(s.index) for s in split[0].addressable_shards})
        if split
        else 0,
    }


def main() -> None:
    assert jax.device_count() == 8, jax.device_count()
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    cases = [(s, m) for s in SAMPLERS for m in MESHES if (s, m) != ("engine", "devices_only")]
    out = {f"{s}/{m}": compare(s, m, model) for s, m in cases}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
