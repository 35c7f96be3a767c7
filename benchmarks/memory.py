"""Peak host memory (RSS) of each role, against its floor, for SmolLM2 and a 0.5 B Qwen2 shape.

Two sections, each role in its own process, one process at a time under
``flock /tmp/rlax-smollm2.lock`` (a shared 24 GB machine: two big runs at once
end in the OOM killer):

1. ``configs/experiments/smollm2_arithmetic.gin`` for ``--steps`` steps (``rlax run``
   with every role: parameter server, trainer, one worker). The benchmark
   polls every process of the run's tree and keeps each role's ``VmHWM``
   (the kernel's peak resident set of that process) from ``/proc``.
2. The Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads / 2 KV, MLP 4864,
   vocab 151936, tied head) with random weights: one GRPO train step
   (clipped adam, the SmolLM2 config's optimiser; block remat, in
   ``--qwen-microbatches`` microbatches) on ``--qwen-rows`` x
   ``--qwen-seq`` tokens, and one sampling batch (``samplers.jax``) of
   ``--qwen-rows`` prompts x ``--qwen-new`` tokens, each in a fresh process
   that reports its own ``ru_maxrss``.

Floors (the bytes a role cannot do without; decimal GB):

- trainer: float32 weights + gradients + adam's two moments = 16 bytes a parameter;
- parameter server: the weights it holds (float32 on the wire: 4 bytes a parameter);
- worker / sampler: float32 weights + its KV cache (rows x cache length x
  layers x 2 x KV heads x head dim x 4 bytes).

The bounds (issue 20): trainer <= 2x its floor, parameter server <= 1.5x,
worker <= 2x; each row of the table says whether it holds. Peak RSS includes
the Python interpreter, JAX's runtime and XLA's compiler (a few hundred MB
that no floor counts), so the bounds are hardest for the smallest roles.

Usage: python benchmarks/memory.py [--steps 2] [--skip-smollm2] [--skip-qwen]
       [--tiny]  (a tiny model in place of the Qwen shape: a fast check of the script)
The last line of output is the JSON result.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time

GB = 1e9
LOCK = "/tmp/rlax-smollm2.lock"
ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2_GIN = ROOT / "configs/experiments/smollm2_arithmetic.gin"
# What configs/experiments/smollm2_arithmetic.gin asks of a worker: a lease of 8 prompts x 4
# samples, prompts padded to 16 tokens (the chat template makes them ~48), 24 new.
SMOLLM2_WORKER_ROWS = 32
SMOLLM2_CACHE_LEN = 64 + 24
BOUNDS = {"trainer": 2.0, "param_server": 1.5, "worker": 2.0}
# The JSON line's keys (issue 20); a skipped section leaves its keys null.
MIN_AVAILABLE = 1.0 * GB  # stop a measurement before the shared machine has less than this
KEYS = (
    "trainer_peak_gb",
    "trainer_floor_gb",
    "ps_peak_gb",
    "worker_peak_gb",
    "qwen05b_train_peak_gb",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2, help="RL steps of the SmolLM2 config")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per section")
    p.add_argument("--qwen-rows", type=int, default=8)
    p.add_argument("--qwen-seq", type=int, default=128, help="tokens of a train row")
    p.add_argument("--qwen-new", type=int, default=32, help="new tokens of a sampled row")
    p.add_argument("--qwen-remat", default="block", help="the 0.5 B train step's remat")
    # 4 of 2 rows: 11.2 GB peak (1.41x its floor) against 16.3 GB (2.06x) for the whole batch.
    p.add_argument("--qwen-microbatches", type=int, default=4, help="the 0.5 B step's microbatches")
    p.add_argument("--skip-smollm2", action="store_true")
    p.add_argument("--skip-qwen", action="store_true")
    p.add_argument("--tiny", action="store_true", help="a tiny model instead of the Qwen shape")
    p.add_argument("--child", choices=["train", "sample"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.qwen_microbatches < 1 or a.qwen_rows % a.qwen_microbatches:
        p.error(f"--qwen-microbatches: {a.qwen_microbatches} does not split {a.qwen_rows} rows")
    return a


# -- floors ------------------------------------------------------------------------


def trainer_floor_bytes(num_params: int) -> int:
    """float32 weights, gradients and adam's first and second moments."""
    return 16 * num_params


def kv_cache_bytes(cfg, rows: int, length: int, itemsize: int = 4) -> int:
    """Keys and values of every layer for ``rows`` sequences of ``length`` slots."""
    return rows * length * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize


# -- peak RSS of processes -------------------------------------------------------------


def vm_hwm_bytes(pid: int) -> int:
    """The peak resident set of a live process (``VmHWM``), 0 if it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmHWM:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def role_of(argv: list[str]) -> str | None:
    """The ``--role`` of an ``rlax run`` command line, or None."""
    if "--role" in argv and argv.index("--role") + 1 < len(argv):
        return argv[argv.index("--role") + 1]
    return None


def descendants(root: int) -> dict[int, list[str]]:
    """Every live process under ``root``: pid -> its command line."""
    parents: dict[int, int] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                try:
                    raw = pathlib.Path(f"/proc/{child}/cmdline").read_bytes()
                except OSError:
                    continue
                found[child] = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
                frontier.append(child)
    return found


def watch_roles(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, dict, str]:
    """Runs ``cmd``; (exit code, each role's peak RSS in bytes, the output's tail)."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )  # its own group: stopped as one
        peaks: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline or (peaks and available_bytes() < MIN_AVAILABLE):
                print(
                    "memory benchmark: out of time or of free memory; stopping the run",
                    file=sys.stderr,
                    flush=True,
                )
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own session: all of its roles
                break
            for pid, argv in descendants(proc.pid).items():
                role = role_of(argv)
                if role is not None:
                    peaks[role] = max(peaks.get(role, 0), vm_hwm_bytes(pid))
            time.sleep(0.1)
        rc = proc.wait()
        log.seek(0)
        return rc, peaks, log.read().decode(errors="replace")[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- section 1: the SmolLM2 config, every role ---------------------------------------------


def smollm2_section(a: argparse.Namespace) -> dict:
    from rlax.core.models.config import TransformerConfig

    cfg = TransformerConfig.smollm2_135m()
    n = cfg.num_params()
    run_dir = tempfile.mkdtemp(prefix="rlax-memory-")
    cmd = [
        "flock",
        LOCK,
        sys.executable,
        "-m",
        "rlax.core.cli",
        "run",
        "--gin",
        str(SMOLLM2_GIN),
        f"--gin.rlax.train.steps={a.steps}",
        "--run-dir",
        run_dir,
    ]
    env = dict(os.environ, RLAX_PS_ADDRESS=f"127.0.0.1:{free_port()}")
    rc, peaks, tail = watch_roles(cmd, env, a.timeout_s)
    if rc != 0:
        raise SystemExit(f"the SmolLM2 run failed (exit {rc}):\n{tail}")
    kv = kv_cache_bytes(cfg, SMOLLM2_WORKER_ROWS, SMOLLM2_CACHE_LEN)
    return {
        "params": n,
        "trainer": (peaks.get("trainer", 0), trainer_floor_bytes(n)),
        "param_server": (peaks.get("param_server", 0), 4 * n),
        "worker": (peaks.get("worker", 0), 4 * n + kv),
        "run_dir_bytes": disk_bytes(pathlib.Path(run_dir)),
    }


def disk_bytes(root: pathlib.Path) -> int:
    """The bytes of the files under ``root``, a file with several names (hard links) once."""
    inodes = {
        (f.stat().st_dev, f.stat().st_ino): f.stat().st_size for f in root.rglob("*") if f.is_file()
    }
    return sum(inodes.values())


# -- section 2: the 0.5 B shape, one role per process ---------------------------------------


def qwen_config(tiny: bool):
    from rlax.core.models.config import TransformerConfig

    if tiny:
        return TransformerConfig(
            vocab_size=512,
            num_layers=2,
            embed_dim=64,
            num_heads=2,
            num_kv_heads=1,
            head_dim=32,
            mlp_dim=128,
            qkv_bias=True,
        )
    return TransformerConfig.qwen2_5_0_5b()


def child_train(a: argparse.Namespace) -> dict:
    """One GRPO step with clipped adam on random weights; this process's peak RSS."""
    import jax
    import optax
    from flax import nnx

    from rlax.core.models.transformer import Transformer
    from rlax.core.parallel.host_memory import reuse_freed_memory
    from rlax.core.trainer.step import Trainer, TrainerSettings
    from rlax.plugins.algorithms.grpo import grpo

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from train_step import make_batch  # the train-step benchmark's batch: same shapes

    reuse_freed_memory()
    cfg = qwen_config(a.tiny)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-5))
    settings = TrainerSettings(remat=a.qwen_remat, microbatches=a.qwen_microbatches)
    trainer = Trainer(Transformer(cfg, rngs=nnx.Rngs(0)), grpo(), optimizer, settings=settings)
    shape = argparse.Namespace(
        batch=a.qwen_rows, seq=a.qwen_seq, prompt=a.qwen_seq // 4, vocab=cfg.vocab_size
    )
    start = time.perf_counter()
    metrics = trainer.step(make_batch(shape))
    jax.block_until_ready(trainer.state.params)
    return {
        "peak": peak_rss_bytes(),
        "floor": trainer_floor_bytes(cfg.num_params()),
        "loss": metrics["loss"],
        "seconds": time.perf_counter() - start,
    }


class _Ids:
    """The least a sampler needs of a tokenizer, for random weights."""

    eos_id = 0

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)


def child_sample(a: argparse.Namespace) -> dict:
    """One sampling batch of random weights; this process's peak RSS."""
    import numpy as np
    from flax import nnx

    from rlax.core.models.transformer import Transformer
    from rlax.core.parallel.host_memory import reuse_freed_memory
    from rlax.core.types import Prompt
    from rlax.plugins.samplers.jax_sampler import JaxSampler

    reuse_freed_memory()
    cfg = qwen_config(a.tiny)
    sampler = JaxSampler(max_new_tokens=a.qwen_new, prompt_bucket=16, stop_at_eos=False)
    sampler.setup(Transformer(cfg, rngs=nnx.Rngs(0)), _Ids())
    rng = np.random.default_rng(0)
    prompts = [
        Prompt(
            str(i), "", rng.integers(1, cfg.vocab_size, size=a.qwen_seq // 4).astype(np.int32), ""
        )
        for i in range(a.qwen_rows)
    ]
    start = time.perf_counter()
    out = sampler.generate(prompts, 1, seed=0)
    rows = max(8, 1 << (a.qwen_rows - 1).bit_length())  # the sampler's row bucket
    cache = -(-(a.qwen_seq // 4) // 16) * 16 + a.qwen_new
    return {
        "peak": peak_rss_bytes(),
        "floor": 4 * cfg.num_params() + kv_cache_bytes(cfg, rows, cache),
        "tokens": sum(len(c.tokens) for g in out for c in g),
        "seconds": time.perf_counter() - start,
    }


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB


def available_bytes() -> int:
    """The kernel's estimate of memory available to a new process (``MemAvailable``)."""
    text = pathlib.Path("/proc/meminfo").read_text()
    return int(re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def guard_memory() -> None:
    """Ends this process (exit 3, a message) if the machine nears running out of memory.

    The machine is shared: a benchmark that grows past what is free must stop
    itself before the kernel's OOM killer picks a victim, maybe someone else's job.
    """
    import threading

    def watch() -> None:
        while True:
            if available_bytes() < MIN_AVAILABLE:
                print(
                    f"memory benchmark: under {MIN_AVAILABLE / GB:.1f} GB left on the machine; "
                    "stopping before the OOM killer does",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(3)
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()


def run_child(a: argparse.Namespace, which: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        which,
        f"--qwen-rows={a.qwen_rows}",
        f"--qwen-seq={a.qwen_seq}",
        f"--qwen-new={a.qwen_new}",
        f"--qwen-remat={a.qwen_remat}",
        f"--qwen-microbatches={a.qwen_microbatches}",
        *(["--tiny"] if a.tiny else []),
    ]
    if not a.tiny:
        cmd = ["flock", LOCK, *cmd]
    out = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=a.timeout_s, cwd=ROOT
    )
    if out.returncode != 0:
        raise SystemExit(f"the {which} child failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the report ------------------------------------------------------------------------------


def table(rows: list[tuple[str, float, float, float | None]]) -> str:
    lines = [f"{'role':<24}{'peak GB':>10}{'floor GB':>10}{'x floor':>9}{'bound':>7}  holds"]
    for name, peak, floor, bound in rows:
        ratio = peak / floor if floor else float("nan")
        holds = "-" if bound is None else ("yes" if ratio <= bound else "NO")
        lines.append(
            f"{name:<24}{peak / GB:>10.2f}{floor / GB:>10.2f}{ratio:>9.2f}"
            f"{'' if bound is None else bound:>7}  {holds}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    a = parse_args(argv)
    if a.child:
        guard_memory()
        return {"train": child_train, "sample": child_sample}[a.child](a)
    rows: list[tuple[str, float, float, float | None]] = []
    result: dict = dict.fromkeys(KEYS)
    if not a.skip_smollm2:
        s = smollm2_section(a)
        for role in ("trainer", "param_server", "worker"):
            peak, floor = s[role]
            rows.append((f"smollm2 {role}", peak, floor, BOUNDS[role]))
        result.update(
            trainer_peak_gb=round(s["trainer"][0] / GB, 2),
            trainer_floor_gb=round(s["trainer"][1] / GB, 2),
            ps_peak_gb=round(s["param_server"][0] / GB, 2),
            worker_peak_gb=round(s["worker"][0] / GB, 2),
        )
        print(
            f"smollm2: {s['params']} params, run directory {s['run_dir_bytes'] / GB:.2f} GB",
            file=sys.stderr,
        )
        print(table(rows), f"\n{json.dumps(result)}", file=sys.stderr, flush=True)
    if not a.skip_qwen:
        name = "tiny" if a.tiny else "qwen0.5b"
        train = run_child(a, "train")
        rows.append((f"{name} train step", train["peak"], train["floor"], BOUNDS["trainer"]))
        print(table(rows[-1:]), file=sys.stderr, flush=True)
        sample = run_child(a, "sample")
        rows.append((f"{name} sampling batch", sample["peak"], sample["floor"], BOUNDS["worker"]))
        result["qwen05b_train_peak_gb"] = round(train["peak"] / GB, 2)
        print(
            f"{name}: train step {train['seconds']:.1f} s (loss {train['loss']:.4f}), "
            f"sampling batch {sample['seconds']:.1f} s ({sample['tokens']} tokens)",
            file=sys.stderr,
        )
    print(table(rows), file=sys.stderr)
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
