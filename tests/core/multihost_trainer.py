"""One process of a multi-host trainer role for ``test_multihost_trainer.py`` (run as a script).

Usage: multihost_trainer.py OUT_DIR RLAX_RUN_ARGS...

Runs ``rlax run ... --role trainer`` in this process exactly as the console
script does (``rlax.core.cli.main``); the process count, id and coordinator
come from the ``RLAX_*`` environment, the parameter server's address and
token too. To let the test check what happened, it records — without
changing it — what the loop does:

- every batch ``Trainer.step`` is given (this process's rows) and the row
  indices of the global batch they are;
- every ``Take`` this process makes of the rollout queue (the prompt ids);
- the metrics rows of the steps it ran;
- at the end, the parameters gathered whole (``distributed.gather_tree``),
  and whether each of this process's shards equals its slice of them.

``RLAX_TEST_NOTICE_AFTER_STEP=k`` sends this process SIGTERM right after its
k-th call of ``Trainer.step`` (a preemption notice that reaches one host only).
Everything goes to ``OUT_DIR/process_<id>-<n>.{json,npz}`` (n counts starts).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: list[str]) -> int:
    out, args = pathlib.Path(argv[0]), argv[1:]
    import jax
    import numpy as np

    from rlax.core import cli
    from rlax.core.parallel import multihost as distributed
    from rlax.core.param_server.client import ParamServerClient
    from rlax.core.trainer.loop import TrainingRun
    from rlax.core.trainer.step import Trainer
    from rlax.core.wire import leaf_name

    record: dict = {"steps": [], "takes": []}
    batches: dict[str, np.ndarray] = {}
    trainers: list[Trainer] = []
    notice_after = int(os.environ.get("RLAX_TEST_NOTICE_AFTER_STEP", "0"))

    step, take, loop = Trainer.step, ParamServerClient.take, TrainingRun.loop

    def recording_loop(self, *a, **kw):
        first = len(self.log.rows)  # process 0 has the rows of the steps it resumed after
        try:
            return loop(self, *a, **kw)
        finally:
            record["metrics"] = self.log.rows[first:]

    def recording_step(self, batch):
        local = {k: np.asarray(v) for k, v in dict(batch).items()}
        n = len(local["tokens"]) * jax.process_count()
        rows = distributed.process_rows(self.mesh, n)
        i = len(record["steps"])
        record["steps"].append({"rows": rows.tolist(), "global_rows": n})
        batches.update({f"{i}.{k}": v for k, v in local.items()})
        trainers[:] = [self]
        metrics = step(self, batch)
        if notice_after and len(record["steps"]) == notice_after:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    def recording_take(self, *a, **kw):
        take_id, groups, stale = take(self, *a, **kw)
        record["takes"].append([g.prompt.id for g in groups])
        return take_id, groups, stale

    Trainer.step, ParamServerClient.take = recording_step, recording_take
    TrainingRun.loop = recording_loop
    status = cli.main(["run", *args, "--role", "trainer"])
    pid = jax.process_index()
    record["status"] = status
    record["process_count"] = jax.process_count()
    if status == 0:  # every process got here: gather the final parameters (a collective)
        params = trainers[0].state.params
        whole = distributed.gather_tree(params)
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        wholes = jax.tree_util.tree_leaves(whole)
        record["shards_equal_whole"] = all(
            np.array_equal(np.asarray(s.data), w[s.index])
            for (_, x), w in zip(flat, wholes)
            for s in x.addressable_shards
        )
        record["param_names"] = [leaf_name(p) for p, _ in flat]
        np.savez(out / f"params_{pid}.npz", *wholes)
    n = len(list(out.glob(f"process_{pid}-*.json")))
    np.savez(out / f"process_{pid}-{n}.npz", **batches)
    (out / f"process_{pid}-{n}.json").write_text(json.dumps(record))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
