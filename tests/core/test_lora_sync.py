"""Adapter-only weight sync: the trainer pushes adapters, a worker merges them into its base."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlax.core.models import lora
from rlax.core.models.lora_wire import AdapterApplier, wire_tree
from rlax.core.models.transformer import Transformer, causal_mask, positions_from_mask
from rlax.core.trainer.sources import InlineRollouts, RemoteRollouts
from rlax.core.trainer.step import Trainer
from rlax.core.wire import WirePlan
from rlax.core.worker.role import Worker
from rlax.plugins.algorithms.grpo import grpo

from .models.test_lora import CFG, batch

TOKENS = jnp.asarray([[3, 4, 5, 6, 7, 8], [0, 3, 3, 8, 4, 5]])
MASK = jnp.asarray([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], bool)


def logits(model):
    out, _ = model(TOKENS, positions_from_mask(MASK), causal_mask(MASK))
    return np.asarray(out)


class RecordingSampler:
    """Keeps what the worker loads (the sampler contract's ``load_weights``)."""

    def __init__(self):
        self.loaded: list[tuple[object, int]] = []

    def load_weights(self, params, version: int) -> None:
        self.loaded.append((params, version))


def trained(seed: int, base_dtype: str = "float32") -> Trainer:
    trainer = Trainer(
        Transformer(CFG, rngs=nnx.Rngs(seed)),
        grpo(),
        optax.adam(0.05),
        lora=lora.LoraConfig(rank=2, base_dtype=base_dtype),
    )
    for _ in range(2):
        trainer.step(batch())
    return trainer


def worker_for(client, base_model) -> tuple[Worker, RecordingSampler]:
    sampler = RecordingSampler()
    worker = Worker(
        client,
        sampler,
        None,
        [],
        group_size=2,
        prompts_per_lease=1,
        reload_staleness=0,
        worker_id="w0",
        seed=0,
        adapters=AdapterApplier(nnx.state(base_model)),
    )
    return worker, sampler


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16"])
def test_worker_applying_a_pushed_adapter_version_gets_the_trainers_logits(ps, base_dtype):
    trainer = trained(0, base_dtype)
    base_model = Transformer(CFG, rngs=nnx.Rngs(0))  # the worker's own copy of the base
    full_plan = WirePlan.for_tree(nnx.state(base_model))
    plan = WirePlan.for_tree(wire_tree(trainer.state.params))
    source = RemoteRollouts(ps.client, plan, prompts_per_step=1, max_staleness=0)
    source.publish(trainer.state.params, 7)
    # Only adapters and three small metadata tensors went over the wire.
    names = [t.name for t in plan.tensors]
    assert all(n.startswith("lora/") for n in names) and "lora/meta/base" in names
    adapter_elems = sum(x.size for x in jax.tree.leaves(trainer.state.params.adapters))
    assert plan.nbytes == 4 * (adapter_elems + 32 + 1 + 1) < full_plan.nbytes / 4
    worker, sampler = worker_for(ps.client, base_model)
    worker.maybe_reload(full_plan)
    ((params, version),) = sampler.loaded
    assert version == 7 == worker.version
    got = logits(nnx.merge(nnx.graphdef(base_model), params))
    np.testing.assert_array_equal(got, logits(trainer.model()))  # the trainer's merged model
    unmerged = logits(lora.model_of(trainer.graphdef, trainer.state.params))
    np.testing.assert_allclose(got, unmerged, atol=1e-5)  # and its training forward
    assert np.abs(got - logits(base_model)).max() > 1e-3  # the adapters were applied


def test_a_version_for_another_base_is_refused(ps):
    trainer = trained(1)
    source = RemoteRollouts(
        ps.client,
        WirePlan.for_tree(wire_tree(trainer.state.params)),
        prompts_per_step=1,
        max_staleness=0,
    )
    source.publish(trainer.state.params, 0)
    other = Transformer(CFG, rngs=nnx.Rngs(2))
    worker, sampler = worker_for(ps.client, other)
    with pytest.raises(ValueError, match="adapter version is for base [0-9a-f]+, this worker's"):
        worker.maybe_reload(WirePlan.for_tree(nnx.state(other)))
    assert sampler.loaded == [] and worker.version == -1


def test_whole_weights_still_load_on_a_worker_that_keeps_a_base(ps):
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    state = nnx.state(model)
    plan = WirePlan.for_tree(state)
    ps.client.push(plan, state, 0)
    worker, sampler = worker_for(ps.client, model)
    worker.maybe_reload(plan)
    np.testing.assert_array_equal(
        logits(nnx.merge(nnx.graphdef(model), sampler.loaded[0][0])), logits(model)
    )


def test_inline_source_loads_the_merged_weights():
    trainer = trained(4)
    sampler = RecordingSampler()
    InlineRollouts(iter(()), sampler, None, [], group_size=2, prompts_per_step=1, seed=0).publish(
        trainer.state.params, 3
    )
    ((params, version),) = sampler.loaded
    assert version == 3
    np.testing.assert_array_equal(
        logits(nnx.merge(trainer.graphdef, params)), logits(trainer.model())
    )
