"""The roles that never import JAX, and their own record of it.

The supervisor of ``rlax run`` (``--role all``) and the parameter server read settings,
start processes and move bytes: neither needs a device, and importing JAX would cost
each start seconds and, on an accelerator host, risk opening a device another role
owns (docs/accelerators.md). Their code imports JAX nowhere on its way
(tests/test_architecture.py holds every module they load to that); and each process
checks it for itself as it stops -- late, so that whatever it ran, a dependency's import
included, is counted -- and writes what it found to ``RUN/processes/ROLE-PID.json``::

    {"role": "supervisor", "pid": 4242, "jax_imported": false, "time": 1765012345.6}

One file per process: a parameter server restarted three times writes three, and a run
its roles refused takes back every file it wrote, these too (``RunDir.remove_new``).
(A supervisor called inside a process that imported JAX itself -- a notebook, a test --
records ``true``: the record is of the process.)
"""

from __future__ import annotations

import json
import os
import sys
import time

from rlax.core.runtime.run_dir import RunDir

__all__ = ["JAX_FREE_ROLES", "jax_imported", "record_jax_free"]

#: The roles that promise not to import JAX (as their records name them).
JAX_FREE_ROLES = ("supervisor", "param_server")


def jax_imported() -> bool:
    """Whether this process has imported JAX (by any module, at any time so far)."""
    return "jax" in sys.modules


def record_jax_free(run_dir: RunDir | str | os.PathLike[str] | None, role: str) -> bool:
    """Writes this process's record to ``RUN/processes/`` (nothing without a run
    directory); returns whether it imported JAX.

    Args:
      run_dir: the run's directory (None: a role started without one records nothing).
      role: one of :data:`JAX_FREE_ROLES`.
    """
    if role not in JAX_FREE_ROLES:
        raise ValueError(f"role {role!r} makes no promise about JAX; one of {JAX_FREE_ROLES}")
    imported = jax_imported()
    if run_dir is not None:
        record = {"role": role, "pid": os.getpid(), "jax_imported": imported, "time": time.time()}
        folder = RunDir.of(run_dir).processes
        folder.mkdir(exist_ok=True)
        (folder / f"{role}-{os.getpid()}.json").write_text(json.dumps(record) + "\n")
    return imported
