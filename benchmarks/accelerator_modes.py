"""The accelerator check's placement figures: each mode's step and sampling on this
process's devices, and the device-to-device weight handoff against a parameter server.

Part of ``benchmarks/accelerator_check.py`` (its JSON line gains these fields):

- ``modes``: for each mode this host can hold (``core/parallel/placement.py``):
  ``colocated`` (the trainer and the sampler on every device) and, with two devices or
  more, ``split`` (the trainer on the placement rule's first half, the sampler on the
  rest, as ``processes`` and ``one_process`` place them): ``{"trainer_devices",
  "sampler_devices", "step_s", "sample_tok_s"}``, each the best of ``--repeats`` calls
  (the trainer an fsdp mesh, the sampler tensor parallel, ``samplers.jax.mesh``).
- ``handoff_s``: the model's bf16 weights moved from the trainer's devices onto the
  sampler's sharding by ``jax.device_put`` (device to device; on one device it is the
  same memory and costs nothing), best of ``--repeats``.
- ``ps_push_pull_s``: the same weights (the same bytes) pushed to a parameter-server
  process on loopback and pulled back (the median after a warm-up version, as
  ``benchmarks/weight_sync.py`` measures), and ``handoff_vs_ps`` the ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from accelerator_check import _Ids, best_seconds
from flax import nnx
from train_step import make_batch

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.inventory import Inventory
from rlax.core.parallel.mesh import MeshConfig, make_mesh, tree_shardings
from rlax.core.parallel.placement import Placement, place_roles
from rlax.core.trainer.microbatch import cast_floats
from rlax.core.trainer.step import Trainer, TrainerSettings
from rlax.core.types import Prompt
from rlax.plugins.algorithms.grpo import grpo
from rlax.plugins.samplers.jax_sampler import JaxSampler

TPU_KINDS = {"TPU v4": "v4", "TPU v5": "v5p", "TPU v5 lite": "v5e", "TPU v6 lite": "v6e"}


def inventory_of(devices: list) -> Inventory:
    """This process's devices as the placement sees a host (CPU devices as accelerators)."""
    kind = devices[0].device_kind
    if devices[0].platform == "tpu" and kind in TPU_KINDS:
        return Inventory("tpu", len(devices), TPU_KINDS[kind])
    return Inventory("gpu", len(devices), kind)


def _step_s(cfg: TransformerConfig, devices: list, a: argparse.Namespace) -> float:
    mesh = make_mesh(MeshConfig(1, -1, 1), devices)
    settings = TrainerSettings(compute_dtype="bfloat16", post_update_kl=False)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-5))
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    trainer = Trainer(model, grpo(), optimizer, mesh=mesh, settings=settings)
    rows = -(-a.rows // len(devices)) * len(devices)  # the batch splits over the devices
    shape = argparse.Namespace(batch=rows, seq=a.seq, prompt=a.seq // 4, vocab=cfg.vocab_size)
    arrays = trainer.device_batch(make_batch(shape))
    trainer.step(arrays)  # compiles
    return best_seconds(lambda: trainer.step(arrays), a.repeats)


def _sample_tok_s(cfg: TransformerConfig, devices: list, a: argparse.Namespace) -> float:
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    sampler = JaxSampler(
        max_new_tokens=a.new, prompt_bucket=16, stop_at_eos=False, mesh=MeshConfig(1, 1, -1)
    )
    sampler.devices = devices
    sampler.setup(model, _Ids())
    sampler.load_weights(cast_floats(nnx.split(model)[1], jnp.bfloat16), 1)
    rng = np.random.default_rng(0)
    prompts = [
        Prompt(str(i), "", rng.integers(1, cfg.vocab_size, size=a.seq // 4).astype(np.int32), "")
        for i in range(a.rows)
    ]
    sampler.generate(prompts, 1, seed=0)  # compiles
    seconds = best_seconds(lambda: sampler.generate(prompts, 1, seed=1), a.repeats)
    return a.rows * a.new / seconds


def mode_probes(cfg: TransformerConfig, a: argparse.Namespace) -> dict:
    """Step seconds and sampler tokens/s for each mode the devices can hold."""
    devices = jax.local_devices()
    plans = {"colocated": (devices, devices)}
    if len(devices) > 1:
        roles = place_roles(inventory_of(devices), Placement(mode="one_process"), workers=0)
        plans["split"] = ([devices[i] for i in roles.trainer], [devices[i] for i in roles.sampler])
    out = {}
    for mode, (trainer, sampler) in plans.items():
        out[mode] = {
            "trainer_devices": len(trainer),
            "sampler_devices": len(sampler),
            "step_s": round(_step_s(cfg, trainer, a), 4),
            "sample_tok_s": round(_sample_tok_s(cfg, sampler, a), 1),
        }
    return out


def handoff_probe(cfg: TransformerConfig, a: argparse.Namespace) -> dict:
    """Device-to-device handoff of the bf16 weights against a parameter-server push + pull."""
    from weight_sync import _push_pull, _server, _settings

    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.wire import WirePlan

    devices = jax.local_devices()
    half = (len(devices) + 1) // 2
    trainer = make_mesh(MeshConfig(1, -1, 1), devices[:half])
    sampler = make_mesh(MeshConfig(1, 1, -1), devices[half:] or devices)
    state = cast_floats(nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))[1], jnp.bfloat16)
    on_trainer = jax.device_put(state, tree_shardings(state, trainer))
    targets = tree_shardings(state, sampler)
    handoff = best_seconds(
        lambda: jax.block_until_ready(jax.device_put(on_trainer, targets)), a.repeats
    )
    # The trainer's host copy (fp32), sent in bf16 as the handoff moves it: the same bytes.
    tree = {str(i): np.asarray(x, np.float32) for i, x in enumerate(jax.tree.leaves(state))}
    plan = WirePlan.for_tree(tree, wire_dtype="bfloat16")
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(ports, stop))
    server.start()
    try:
        client = ParamServerClient(_settings(ports.get(timeout=120)))
        rounds = range(1 + max(1, a.repeats))
        push_s, pull_s = _push_pull(client, plan, tree, plan.pack(tree), rounds, 1)
        client.close()
    finally:
        stop.set()
        server.join(timeout=30)
    ps = push_s + pull_s
    return {
        "handoff_s": round(handoff, 6),
        "ps_push_pull_s": round(ps, 4),
        "handoff_vs_ps": round(handoff / ps, 4),
        "handoff_bytes": plan.nbytes,
    }


def probe(cfg: TransformerConfig, a: argparse.Namespace) -> dict:
    """The fields this module adds to the check's JSON line."""
    start = time.perf_counter()
    out = {"modes": mode_probes(cfg, a), **handoff_probe(cfg, a)}
    out["modes_s"] = round(time.perf_counter() - start, 1)
    return out
