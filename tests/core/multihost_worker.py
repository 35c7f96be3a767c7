"""One trainer process of ``test_multihost.py`` (run as a script, 4 fake CPU devices).

Usage: multihost_worker.py PROCESS_ID NUM_PROCESSES COORDINATOR OUT_DIR [PS_ADDRESS TOKEN]

Joins the others through ``jax.distributed.initialize``, trains STEPS steps on
the global batches of ``multihost_case`` (feeding only its own rows), saves its
shards of the parameters and its metrics to OUT_DIR, and, given a parameter
server, pushes its shards as its part of version 1.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: list[str]) -> int:
    pid, nproc, coordinator, out = int(argv[0]), int(argv[1]), argv[2], pathlib.Path(argv[3])
    from rlax.core.parallel import multihost as distributed
    from rlax.core.trainer import publish_shards

    assert distributed.initialize(
        distributed.DistributedSettings(coordinator, nproc, pid, initialization_timeout_s=120)
    )
    import jax
    import numpy as np

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import multihost_case as case

    assert jax.process_count() == nproc and jax.device_count() == 4 * nproc
    trainer = case.trainer(mesh=case.MESH)
    metrics, packed_rows = [], []
    for step in range(case.STEPS):
        batch = case.batch(step)
        rows = distributed.process_rows(trainer.mesh, case.ROWS)
        own = {k: v[rows] for k, v in batch.items()}
        packed_rows.append(len(trainer.layout(own)["packed_tokens"]))  # this process's
        metrics.append(trainer.step(own))
    shards = publish_shards.local_shards(trainer.state.params)
    np.savez(
        out / f"shards_{pid}.npz",
        **{f"{i}": s.data for i, s in enumerate(shards)},
    )
    meta = [{"name": s.name, "index": s.index, "shape": s.shape, "start": s.start} for s in shards]
    (out / f"meta_{pid}.json").write_text(
        json.dumps(
            {"shards": meta, "metrics": metrics, "rows": rows.tolist(), "packed_rows": packed_rows}
        )
    )
    if len(argv) > 4:
        from rlax.core.param_server.client import ParamServerClient
        from rlax.core.param_server.settings import ServerSettings

        client = ParamServerClient(ServerSettings(address=argv[4], token=argv[5]), retry_s=10)
        reply = publish_shards.push_local_shards(client, trainer.state.params, version=1)
        (out / f"push_{pid}.json").write_text(
            json.dumps({"version": reply.version, "committed": reply.committed})
        )
        client.close()
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
