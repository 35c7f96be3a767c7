"""Loading keeps one copy of the weights: the host dict is consumed, the LoRA base loads lazily."""

import jax
import numpy as np
from flax import nnx

from rlax.core.models.config import TransformerConfig
from rlax.core.models.hf import model_from_params
from rlax.core.models.lora_wire import AdapterApplier
from rlax.core.models.transformer import Transformer

CFG = TransformerConfig(
    vocab_size=32, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
)


def _host_params(seed: int) -> dict:
    state = nnx.to_pure_dict(nnx.state(Transformer(CFG, rngs=nnx.Rngs(seed))))
    return jax.tree.map(lambda x: np.asarray(x).copy(), state)


def test_model_from_params_consumes_the_host_dict_leaf_by_leaf():
    params = _host_params(3)
    expected = jax.tree.map(np.copy, params)
    model = model_from_params(CFG, params)
    # Before: numpy leaves. After: every leaf of the same dict is a JAX array (the host ones
    # have no holder left), and the model holds exactly the values given.
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
    got = nnx.to_pure_dict(nnx.state(model))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_adapter_base_given_as_a_loader_loads_once_and_only_when_asked():
    calls = []
    base = nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))

    def load():
        calls.append(1)
        return base

    applier = AdapterApplier(load)
    assert calls == []  # a worker pulling whole weights never loads a second copy
    assert applier.base is base and applier.base is base
    assert calls == [1]
    assert AdapterApplier(base).base is base  # a state given directly is kept as it is
