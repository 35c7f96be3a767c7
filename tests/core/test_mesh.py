"""Mesh shapes and sharding rules, checked by name and shape without devices."""

from __future__ import annotations

import re

import jax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from rlax.core.models.config import TransformerConfig
from rlax.core.models.transformer import Transformer
from rlax.core.parallel.mesh import (
    AXES,
    DEFAULT_RULES,
    MeshConfig,
    batch_spec,
    describe,
    make_mesh,
    param_name,
    spec_for,
    tree_specs,
)
from rlax.plugins.critics.head import HeadCritic
from rlax.plugins.critics.separate import SeparateCritic


def sizes(**named: int) -> tuple[int, ...]:
    """The mesh shape in AXES order: the named axes' sizes, every other axis 1."""
    return tuple(named.get(axis, 1) for axis in AXES)


MESH = AbstractMesh(sizes(data=2, fsdp=4, tensor=2), AXES)


def test_minus_one_takes_the_devices_left():
    assert MeshConfig(data=2, fsdp=-1, tensor=2).shape(16) == sizes(data=2, fsdp=4, tensor=2)
    assert MeshConfig(data=-1, fsdp=1, tensor=1).shape(8) == sizes(data=8)
    assert MeshConfig(2, 4, 1).shape(8) == sizes(data=2, fsdp=4)


@pytest.mark.parametrize(
    ("config", "devices", "message"),
    [
        (MeshConfig(3, -1, 1), 8, "8 devices are not a multiple of 3"),
        (MeshConfig(2, 2, 1), 8, "needs 4 devices, have 8"),
    ],
)
def test_impossible_shapes_are_errors(config, devices, message):
    with pytest.raises(ValueError, match=message):
        config.shape(devices)


def test_invalid_configs_are_errors():
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        MeshConfig(-1, -1, 1)
    with pytest.raises(ValueError, match="positive or -1"):
        MeshConfig(0, 1, 1)


def test_one_device_mesh():
    mesh = make_mesh(MeshConfig(1, -1, 1), jax.devices()[:1])
    assert mesh.axis_names == AXES and mesh.devices.shape == sizes()


@pytest.mark.parametrize(
    ("name", "shape", "spec"),
    [
        ("embed/embedding", (1024, 256), P("tensor", "fsdp")),
        ("blocks/3/attn/q/kernel", (256, 256), P("fsdp", "tensor")),
        ("blocks/3/attn/k/kernel", (256, 128), P("fsdp", "tensor")),
        ("blocks/3/attn/k/bias", (128,), P("tensor")),  # Qwen2
        ("blocks/0/attn/o/kernel", (256, 256), P("tensor", "fsdp")),
        ("blocks/0/mlp/up/kernel", (256, 1024), P("fsdp", "tensor")),
        ("blocks/0/mlp/down/kernel", (1024, 256), P("tensor", "fsdp")),
        ("blocks/0/attn/q_norm/scale", (64,), P(None)),  # Qwen3
        ("final_norm/scale", (256,), P(None)),
        ("head/kernel", (256, 1024), P("fsdp", "tensor")),
        ("trunk/blocks/0/attn/q/kernel", (256, 256), P("fsdp", "tensor")),  # separate critic
        ("head/proj/kernel", (256, 1), P("fsdp", None)),  # its value head
        ("head/proj/bias", (1,), P(None)),
        # Optimiser state mirrors the parameter it belongs to; scalars stay replicated.
        ("1/0/mu/blocks/2/mlp/gate/kernel", (256, 1024), P("fsdp", "tensor")),
        ("1/0/count", (), P()),
        ("something/else", (7, 3), P()),
    ],
)
def test_rules_by_name(name, shape, spec):
    assert spec_for(name, shape, MESH) == spec


def test_indivisible_dimensions_are_replicated():
    # D = 6 does not split over 4 fsdp devices, 3 columns not over 2 tensor devices.
    assert spec_for("blocks/0/attn/k/kernel", (6, 16), MESH) == P(None, "tensor")
    assert spec_for("blocks/0/attn/k/kernel", (8, 3), MESH) == P("fsdp", None)


def test_first_matching_rule_wins_and_rules_are_replaceable():
    rules = ((r"attn/q/kernel$", (None, None)), *DEFAULT_RULES)
    assert spec_for("blocks/0/attn/q/kernel", (8, 8), MESH, rules) == P(None, None)
    assert spec_for("blocks/0/attn/k/kernel", (8, 8), MESH, rules) == P("fsdp", "tensor")


def test_every_parameter_of_the_model_families_has_a_rule():
    # Every leaf of Llama (untied head), Qwen2 (q/k/v bias), Qwen3 (q/k norm) with an
    # output-projection bias, and of both critics, is matched by a rule of its rank:
    # nothing is replicated by accident.
    cfg = TransformerConfig(
        vocab_size=64,
        num_layers=2,
        embed_dim=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
        tie_embeddings=False,
        qkv_bias=True,
        o_bias=True,
        qk_norm=True,
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    trees = [
        nnx.state(model),
        nnx.state(SeparateCritic().build(model, nnx.Rngs(0))),
        nnx.state(HeadCritic().build(model, nnx.Rngs(0))),
    ]
    names = {param_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(trees[0])[0]}
    assert {"blocks/0/attn/q/bias", "blocks/0/attn/o/bias", "blocks/0/attn/k_norm/scale"} <= names
    for tree in trees:
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = param_name(path)
            matched = [spec for pattern, spec in DEFAULT_RULES if re.search(pattern, name)]
            assert matched and len(matched[0]) == x.ndim, name
    specs = tree_specs(nnx.state(model), MESH)
    assert specs["blocks"][1]["mlp"]["gate"]["kernel"] == P("fsdp", "tensor")


def test_batch_is_split_over_data_fsdp_and_expert():
    # The expert axis splits rows too: outside the experts it is data parallelism.
    assert batch_spec(2) == P(("data", "fsdp", "expert"), None)
    assert batch_spec(1) == P(("data", "fsdp", "expert"))


def test_describe_lists_each_parameter_with_its_shape_and_spec():
    cfg = TransformerConfig(
        vocab_size=64,
        num_layers=1,
        embed_dim=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
    )
    layout = describe(nnx.state(Transformer(cfg, rngs=nnx.Rngs(0))), MESH)
    assert layout["blocks/0/mlp/down/kernel"] == "(64, 32) P('tensor', 'fsdp')"
    assert layout["final_norm/scale"] == "(32,) P(None,)"
