"""The roles that never import JAX, and their own record of it.

The supervisor of ``rlax run`` (``--role all``) and the parameter server read settings,
start processes and move bytes: neither needs a device, and importing JAX would cost
each start seconds and, on an accelerator host, risk opening a device another role
owns (docs/accelerators.md). Their code imports JAX nowhere on its way
(tests/test_architecture.py holds every module they load to that); and each process
checks it for itself as it stops -- late, so that whatever it ran, a dependency's import
included, is counted -- and appends one line to ``RUN/processes.jsonl``::

    {"role": "supervisor", "pid": 4242, "jax_imported": false, "time": 1765012345.6}

One line per process: a parameter server restarted three times writes three. A process
that did import JAX says so on stderr too, as a warning.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from rlax.core.runtime.run_dir import RunDir

__all__ = ["JAX_FREE_ROLES", "jax_imported", "record_jax_free"]

#: The roles that promise not to import JAX (as ``processes.jsonl`` names them).
JAX_FREE_ROLES = ("supervisor", "param_server")

log = logging.getLogger("rlax.roles")


def jax_imported() -> bool:
    """Whether this process has imported JAX (by any module, at any time so far)."""
    return "jax" in sys.modules


def record_jax_free(run_dir: RunDir | str | os.PathLike[str] | None, role: str) -> bool:
    """Appends this process's line to ``RUN/processes.jsonl`` (nothing without a run
    directory) and warns if it imported JAX; returns whether it did.

    Args:
      run_dir: the run's directory (None: a role started without one records nothing).
      role: one of :data:`JAX_FREE_ROLES`.
    """
    if role not in JAX_FREE_ROLES:
        raise ValueError(f"role {role!r} makes no promise about JAX; one of {JAX_FREE_ROLES}")
    imported = jax_imported()
    if imported:
        log.warning("the %s imported JAX (pid %d); it never needs it", role, os.getpid())
    if run_dir is not None:
        line = {"role": role, "pid": os.getpid(), "jax_imported": imported, "time": time.time()}
        with RunDir.of(run_dir).processes.open("a") as f:
            f.write(json.dumps(line) + "\n")
    return imported
