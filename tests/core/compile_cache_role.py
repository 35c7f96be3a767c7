"""A role's JAX work in a process of its own, for ``test_compile_cache.py``.

``python compile_cache_role.py RUN [other-jaxlib]`` turns the run's compilation cache on
as a role does (:func:`rlax.core.runtime.compile_cache.start`, before anything
compiles), loads a tiny policy (as from a checkpoint: host arrays, nothing compiled)
and takes two trainer steps on it, then prints one JSON line: the cache's hits and
misses, the whole programs read back (:mod:`rlax.core.runtime.executables`), how many
programs this process asked the cache for, the functions its steps traced, and the losses.
``other-jaxlib`` makes this process's jaxlib version read differently, as a role of
another release would, and stops once the trainer is built (its first program).
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"  # JAX asks the cache
TRACE = "/jax/core/compile/jaxpr_trace_duration"  # a function traced


def main(run: str, other_jaxlib: bool) -> None:
    import jax

    from rlax.core.runtime import compile_cache
    from rlax.core.runtime.run_dir import RunDir

    if other_jaxlib:  # the version JAX writes into each cache key
        from jax._src import cache_key

        cache_key.jaxlib_version_str += ".other"
    requests: list[str] = []
    traced: list[str] = []
    jax.monitoring.register_event_listener(
        lambda event, **_: requests.append(event) if event == REQUESTS else None
    )
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, **__: traced.append(event) if event == TRACE else None
    )
    where = compile_cache.start(compile_cache.CompileCacheSettings(), RunDir(run))
    trainer = _trainer()
    batch = _batch()
    traced.clear()  # from here: the steps' own programs
    losses = [] if other_jaxlib else [trainer.step(batch)["loss"] for _ in range(2)]
    counts = compile_cache.counts()
    report = {"cache": str(where), "hits": counts.hits, "misses": counts.misses}
    report.update(loaded=counts.loaded, steps_traced=len(traced))
    print(json.dumps({**report, "requests": len(requests), "losses": losses}))


def _trainer():
    """The trainer of a tiny policy loaded as from a checkpoint (host arrays: no program)."""
    import jax
    import optax
    from flax import nnx

    from rlax.core.models.bundle import abstract_model
    from rlax.core.models.config import TransformerConfig
    from rlax.core.trainer.step import Trainer
    from rlax.plugins.algorithms.grpo import grpo

    cfg = TransformerConfig(
        vocab_size=9,
        num_layers=1,
        embed_dim=16,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=32,
    )
    rng = np.random.default_rng(0)
    model = abstract_model(cfg)
    state = nnx.state(model)
    weights = jax.tree.map(
        lambda x: (0.3 * rng.standard_normal(x.shape)).astype(x.dtype), nnx.to_pure_dict(state)
    )
    nnx.replace_by_pure_dict(state, weights)
    nnx.update(model, state)
    return Trainer(model, grpo(), optax.sgd(0.1))


def _batch():
    """The shared toy batch (tests/toy_groups.py): two groups of three, rewards (1, 0, 0)."""
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    from toy_groups import toy_batch

    return toy_batch(seed=1)


if __name__ == "__main__":
    main(sys.argv[1], other_jaxlib=sys.argv[2:] == ["other-jaxlib"])
