"""Checkpoint cost: how long a save blocks the train loop, vs a synchronous ``np.save``.

One run: the parameters of a decoder (``--layers`` x ``--width``, with Adam's
two moments: the trainer's whole state) are updated by a jitted step that
donates the optimiser state, as the trainer's does, and every ``--every``
steps the state is checkpointed with :class:`rlax.core.trainer.checkpoint.Checkpointer`
(orbax, asynchronous, the last 2 kept). Measured, each the median over
``--saves`` saves:

  blocking_s   how long ``Checkpointer.save`` holds the loop (no earlier save in
               flight: a loop that checkpoints every few minutes never waits
               for one)
  sync_save_s  writing the same arrays with ``np.save`` (one file, host copies
               first, then the bytes to disk): what a synchronous save would
               hold the loop for
  ratio        blocking_s / sync_save_s (target: <= 0.1)
  restore_s    ``Checkpointer.restore_latest`` into the live structure, with its
               checksum verification

    python benchmarks/checkpoint.py [--layers 6 --width 768 --saves 3]

Prints a table, then one JSON line: ``{"blocking_s", "sync_save_s", "ratio", "restore_s"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import numpy as np
import optax
from flax import nnx

from rlax.core.models.bundle import new_model
from rlax.core.models.config import TransformerConfig
from rlax.core.trainer.checkpoint import Checkpointer


def build_state(layers: int, width: int):
    cfg = TransformerConfig(
        vocab_size=8192,
        num_layers=layers,
        embed_dim=width,
        num_heads=width // 64,
        num_kv_heads=max(1, width // 256),
        head_dim=64,
        mlp_dim=width * 8 // 3,
    )
    _, params = nnx.split(new_model(cfg, 0))
    opt = optax.adam(1e-4)
    opt_state = opt.init(params)

    def step(params, opt_state):
        grads = jax.tree.map(lambda p: 1e-3 * p, params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return params, opt_state, jax.jit(step, donate_argnums=(1,))


def np_save(path: pathlib.Path, tree) -> float:
    start = time.perf_counter()
    with path.open("wb") as f:
        for leaf in jax.tree.leaves(tree):
            np.save(f, np.asarray(leaf))
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--every", type=int, default=4)
    args = parser.parse_args()

    params, opt_state, step = build_state(args.layers, args.width)
    nbytes = sum(x.nbytes for x in jax.tree.leaves((params, opt_state)))
    blocking, sync, loop_steps = [], [], []
    with tempfile.TemporaryDirectory(prefix="rlax-ckpt-bench-") as tmp:
        ckpt = Checkpointer(pathlib.Path(tmp) / "ckpt", keep=2)
        for i in range(args.saves * args.every):
            start = time.perf_counter()
            params, opt_state = step(params, opt_state)
            jax.block_until_ready(opt_state)
            loop_steps.append(time.perf_counter() - start)
            if (i + 1) % args.every == 0:
                ckpt.wait()  # measure a save that finds no other in flight
                state = (params, opt_state, None)
                sync.append(np_save(pathlib.Path(tmp) / "state.npy", state))
                blocking.append(ckpt.save(i + 1, state, {"step": i + 1}))
        ckpt.close()
        start = time.perf_counter()
        restored = Checkpointer(pathlib.Path(tmp) / "ckpt").restore_latest(
            (params, opt_state, None)
        )
        restore_s = time.perf_counter() - start
        assert restored is not None and restored.step == args.saves * args.every

    figures = {
        "blocking_s": round(statistics.median(blocking), 4),
        "sync_save_s": round(statistics.median(sync), 4),
        "ratio": round(statistics.median(blocking) / statistics.median(sync), 4),
        "restore_s": round(restore_s, 3),
    }
    print(
        f"\ncheckpoint of the trainer's state: {nbytes / 2**20:.0f} MB "
        f"(params + Adam moments, {args.layers} layers x {args.width}), "
        f"{os.cpu_count()} CPUs, median of {args.saves} saves"
    )
    print(f"{'':<34}{'seconds':>10}")
    print(f"{'train step (jitted update)':<34}{statistics.median(loop_steps):>10.3f}")
    print(f"{'Checkpointer.save blocks the loop':<34}{figures['blocking_s']:>10.3f}")
    print(f"{'np.save of the same bytes':<34}{figures['sync_save_s']:>10.3f}")
    print(f"{'ratio (target <= 0.1)':<34}{figures['ratio']:>10.3f}")
    print(f"{'restore (with CRC32 checks)':<34}{figures['restore_s']:>10.3f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
